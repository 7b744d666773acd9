//! The JSONL dataset env: tasks from a file, prompts with system and few-shot turns, the built-in
//! matchers as rewards, train/eval splits, and errors naming the file, line and field.

use rl_serve::fake_model::{FakeModel, FakeReply, FakeRequest};
use rl_serve::pb;
use serde_json::{Value, json};

use crate::{actor, example, serve};

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

fn math_file(dir: &tempfile::TempDir) -> String {
    let rows: Vec<String> = (0..10)
        .map(|i| json!({"problem": format!("What is {i} * 7?"), "solution": i * 7, "info": {"id": i}}).to_string())
        .collect();
    write(dir, "math.jsonl", &format!("{}\n\n", rows.join("\n")))
}

#[tokio::test]
async fn a_math_file_trains_through_the_dataset_env() {
    let dir = tempfile::tempdir().unwrap();
    let args = json!({
        "path": math_file(&dir),
        "prompt_field": "problem",
        "answer_field": "solution",
        "system_prompt": "Put the final answer in \\boxed{}.",
        "few_shot": [{"user": "What is 1 * 2?", "assistant": "\\boxed{2}"}],
        "reward": "boxed",
        "eval_fraction": 0.2,
        "seed": 3,
    });
    let h = serve("dataset", args).await;
    let info = h.client.info().await.unwrap();
    let sizes: Vec<(String, u64)> = info.splits.iter().map(|s| (s.name.clone(), s.size)).collect();
    assert_eq!(sizes, [(String::from("train"), 8), (String::from("test"), 2)]);
    // Right for even numbers (as 1,000-style text when large), wrong for odd, unboxed every other call.
    let model = FakeModel::start(|r: &FakeRequest| {
        let n: i64 = r.last_user().split_whitespace().nth(2).unwrap().parse().unwrap();
        let answer = if n % 2 == 0 { n * 7 } else { n * 7 + 1 };
        FakeReply::Text(match r.body["seed"].as_u64() {
            Some(7) => format!("{n} times 7 is \\boxed{{{answer}}}"),
            _ => format!("{answer}"),
        })
    })
    .await;
    let mut rewards = Vec::new();
    for index in 0..8 {
        let resp = h
            .client
            .run_group(pb::RunGroupRequest {
                example: example("train", index),
                group_size: 2,
                actor: Some(actor(&model, "0")),
                ..Default::default()
            })
            .await
            .unwrap();
        let (boxed, plain) = (&resp.episodes[0].traces[0], &resp.episodes[1].traces[0]);
        let roles: Vec<&str> = boxed.nodes.iter().map(|n| n.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user", "assistant"]);
        assert_eq!(boxed.metrics["extracted"], 1.0);
        assert_eq!((plain.metrics["extracted"], plain.reward), (0.0, 0.0));
        let task: Value = serde_json::from_str(&boxed.task_json).unwrap();
        let n = task["info"]["id"].as_i64().unwrap();
        rewards.push((n, boxed.reward));
    }
    assert!(rewards.iter().all(|(n, r)| *r == if n % 2 == 0 { 1.0 } else { 0.0 }), "{rewards:?}");
}

#[tokio::test]
async fn bad_files_and_args_name_the_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let err = |args: Value| async move {
        rl_envs::load("dataset", args.as_object().unwrap()).await.err().map(|e| e.to_string()).unwrap_or_default()
    };
    let missing = write(&dir, "missing.jsonl", "{\"question\": \"q\", \"answer\": \"a\"}\n{\"question\": \"q2\"}\n");
    let e = err(json!({"path": missing})).await;
    assert!(e.contains("missing.jsonl:2: missing field `answer` (the row has: question)"), "{e}");
    let broken = write(&dir, "broken.jsonl", "{\"question\": \"q\", \"answer\": \"a\"}\n{\"question\": \n");
    let e = err(json!({"path": broken})).await;
    assert!(e.contains("broken.jsonl:2: not valid JSON"), "{e}");
    let typed = write(&dir, "typed.jsonl", "{\"question\": [1], \"answer\": \"a\"}\n");
    let e = err(json!({"path": typed})).await;
    assert!(e.contains("typed.jsonl:1: `question[0]` must be a message object"), "{e}");
    let typed = write(&dir, "typed2.jsonl", "{\"question\": {\"a\": 1}, \"answer\": \"a\"}\n");
    let e = err(json!({"path": typed})).await;
    assert!(
        e.contains("typed2.jsonl:1: field `question` must be a string, a number or a list of chat messages"),
        "{e}"
    );
    let e = err(json!({"path": dir.path().join("nope.jsonl")})).await;
    assert!(e.contains("env.args.path") && e.contains("cannot read"), "{e}");
    let good = math_file(&dir);
    let fields = |extra: Value| {
        let mut a = json!({"path": good, "prompt_field": "problem", "answer_field": "solution"});
        a.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        a
    };
    let e = err(fields(json!({"reward": "regex"}))).await;
    assert!(e.contains("env.args.pattern") && e.contains("needs a `pattern`"), "{e}");
    let e = err(fields(json!({"reward": "exact", "tolerance": 0.1}))).await;
    assert!(e.contains("env.args.tolerance"), "{e}");
    let e = err(fields(json!({"reward": "fuzzy"}))).await;
    assert!(e.contains("env.args.reward") && e.contains("exact, normalized, difflib, regex, boxed, numeric"), "{e}");
    let e = err(fields(json!({"few_shot": [{"user": "x"}]}))).await;
    assert!(e.contains("env.args.few_shot[0]"), "{e}");
    let e = err(fields(json!({"eval_fraction": 0.5, "eval_path": good}))).await;
    assert!(e.contains("not both"), "{e}");
    let e = err(json!({"path": write(&dir, "data.parquet", "")})).await;
    assert!(e.contains("env.args.path") && e.contains("data.parquet: cannot read Parquet"), "{e}");
    let e = err(json!({"path": good, "name": "org/data"})).await;
    assert!(e.contains("env.args.name") && e.contains("not both"), "{e}");
    let e = err(json!({"path": good, "split": "test"})).await;
    assert!(e.contains("env.args.split") && e.contains("dataset `name`"), "{e}");
    let e = err(json!({})).await;
    assert!(e.contains("`path`") && e.contains("`name`"), "{e}");
}

/// A Hugging Face dataset directory (Parquet shards as pyarrow writes them, split by file name)
/// gives the env its train and test tasks; a split that is not there is named.
#[tokio::test]
async fn a_hugging_face_dataset_gives_the_splits() {
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/../rl-data/tests/fixtures");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::copy(format!("{fixtures}/lz4.parquet"), data.join("train-00000-of-00001.parquet")).unwrap();
    std::fs::copy(format!("{fixtures}/gzip.parquet"), data.join("test-00000-of-00001.parquet")).unwrap();
    let name = dir.path().to_string_lossy().into_owned();
    let h = serve("dataset", json!({"name": name, "eval_split": "test", "reward": "exact"})).await;
    let info = h.client.info().await.unwrap();
    let sizes: Vec<(String, u64)> = info.splits.iter().map(|s| (s.name.clone(), s.size)).collect();
    assert_eq!(sizes, [(String::from("train"), 2), (String::from("test"), 2)]);
    let e = rl_envs::load("dataset", json!({"name": name, "split": "validation"}).as_object().unwrap())
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("env.args.name") && e.contains("no data files for split `validation`"), "{e}");
}

/// `datasets`' own formats: a `save_to_disk` DatasetDict (conversational prompts, Arrow shards)
/// gives its splits, and a CSV file its rows, typed as pandas types them (a number answer scores
/// as its text).
#[tokio::test]
async fn a_saved_dataset_dict_and_a_csv_file_give_tasks() {
    let lib = concat!(env!("CARGO_MANIFEST_DIR"), "/../rl-data/tests/datasets_lib");
    let args =
        json!({"name": format!("{lib}/dict"), "eval_split": "test", "prompt_field": "prompt", "reward": "exact"});
    let h = serve("dataset", args).await;
    let info = h.client.info().await.unwrap();
    let sizes: Vec<(String, u64)> = info.splits.iter().map(|s| (s.name.clone(), s.size)).collect();
    assert_eq!(sizes, [(String::from("train"), 4), (String::from("test"), 1)]);
    let args = json!({"path": format!("{lib}/rows.csv"), "reward": "exact"});
    let h = serve("dataset", args).await;
    let info = h.client.info().await.unwrap();
    assert_eq!(info.splits.iter().map(|s| s.size).sum::<u64>(), 3);
}

/// A conversational prompt (a list of chat messages, as verifiers and TRL datasets hold them) is
/// the prompt as given; its own system message comes first and wins over `system_prompt`, and
/// few-shot turns follow the system message.
#[tokio::test]
async fn a_message_list_prompt_is_used_as_given() {
    let dir = tempfile::tempdir().unwrap();
    let rows = [
        json!({"prompt": [{"role": "system", "content": "Own rules."}, {"role": "user", "content": "2+2?"}], "answer": "4"}),
        json!({"prompt": [{"role": "user", "content": "3+3?"}], "answer": 6}),
    ];
    let path = write(&dir, "chat.jsonl", &rows.iter().map(Value::to_string).collect::<Vec<_>>().join("\n"));
    let args = json!({"path": path, "prompt_field": "prompt", "system_prompt": "Default rules.",
                      "few_shot": [{"user": "1+1?", "assistant": "2"}], "reward": "numeric"});
    let env = rl_envs::load("dataset", args.as_object().unwrap()).await.unwrap();
    let roles_and_text = |msgs: Vec<rl_serve::Message>| -> Vec<(String, String)> {
        msgs.into_iter().map(|m| (m.role.as_str().to_owned(), m.content)).collect()
    };
    let own = env.prompt(&env.task("train", 0).unwrap()).await.unwrap();
    let pair = |r: &str, t: &str| (r.to_owned(), t.to_owned());
    assert_eq!(
        roles_and_text(own),
        [pair("system", "Own rules."), pair("user", "1+1?"), pair("assistant", "2"), pair("user", "2+2?")]
    );
    let plain = env.prompt(&env.task("train", 1).unwrap()).await.unwrap();
    assert_eq!(
        roles_and_text(plain),
        [pair("system", "Default rules."), pair("user", "1+1?"), pair("assistant", "2"), pair("user", "3+3?")]
    );
    let bad =
        write(&dir, "bad.jsonl", &json!({"prompt": [{"role": "narrator", "content": "x"}], "answer": "1"}).to_string());
    let e = rl_envs::load("dataset", json!({"path": bad, "prompt_field": "prompt"}).as_object().unwrap())
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("bad.jsonl:1") && e.contains("prompt[0].role"), "{e}");
}
