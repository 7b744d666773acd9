//! Environments written in Python (`python/rl-env`), hosted by the env server: the reverse-text
//! trace tests pass against the Python port, the two score identical replies identically, tools and
//! multi-turn replies become trace nodes, and a broken reward function, a hanging tool or a crashed
//! worker give per-trace errors while the server keeps serving.

use std::path::PathBuf;

use rl_serve::fake_model::{FakeModel, FakeReply, FakeRequest};
use rl_serve::{Message, RubricGroup, ScoringContext, State, Task, TrainingContext, branches, pb};
use serde_json::{Value, json};

use crate::reverse_text::{check_group, check_penalty};
use crate::{actor, example, serve};

fn sdk() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../python/rl-env")
}

/// Args of the `python` env for a file of the SDK's examples (or any path) and its own args.
fn python_args(file: &str, args: &Value) -> Value {
    let path =
        if file.ends_with(".py") && !file.contains('/') { sdk().join("examples").join(file) } else { file.into() };
    json!({"file": path, "sys_path": [sdk().join("src")], "args": args})
}

fn user_file(dir: &tempfile::TempDir, source: &str) -> String {
    let path = dir.path().join("user_env.py");
    std::fs::write(&path, source).unwrap();
    path.to_string_lossy().into_owned()
}

#[tokio::test]
async fn the_python_reverse_text_passes_the_reverse_text_trace_tests() {
    let h = serve("python", python_args("reverse_text.py", &json!({"num_examples": 20, "min_len": 5, "max_len": 10})))
        .await;
    check_group(&h).await;
    let args = json!({"num_examples": 5, "format_penalty": 0.5, "penalty_warmup_steps": 10});
    check_penalty(&serve("python", python_args("reverse_text.py", &args)).await).await;
}

async fn score(rubric: &RubricGroup, task: &Task, reply: &str, step: u64) -> f64 {
    let messages = vec![Message::system("s"), Message::user("u"), Message::assistant(reply)];
    let state = State { messages: messages.clone(), turns: 1, ..State::default() };
    let context = TrainingContext { step, ..TrainingContext::default() };
    let ctx = ScoringContext {
        task,
        messages: &messages,
        state: &state,
        training_context: Some(&context),
        models: &rl_serve::NO_MODELS,
        client: None,
    };
    let scores = rubric.score(&ctx).await;
    assert!(scores.errors.is_empty(), "{:?}", scores.errors);
    scores.total()
}

#[tokio::test]
async fn python_and_rust_reverse_text_score_identical_replies_identically() {
    let args = json!({"format_penalty": 0.3, "penalty_warmup_steps": 4});
    let rust = rl_envs::load("reverse-text", args.as_object().unwrap()).await.unwrap();
    let python = rl_envs::load("python", python_args("reverse_text.py", &args).as_object().unwrap()).await.unwrap();
    let text = "the quick brown fox";
    let rust_task = Task { key: String::from("inline"), data: json!({"text": text, "answer": "xof nworb kciuq eht"}) };
    let py_task = python.inline_task(json!({"question": text, "answer": "xof nworb kciuq eht"})).unwrap();
    let replies = [
        "<reversed_text>xof nworb kciuq eht</reversed_text>",
        "<reversed_text> xof nwrb kciuq</reversed_text>",
        "Here: <reversed_text>eht kciuq</reversed_text> done",
        "xof nworb kciuq eht",
        "<reversed_text>unclosed",
        "<reversed_text></reversed_text>",
        "<reversed_text>ǝɥʇ ✓ 🦊 xof</reversed_text>",
    ];
    for reply in replies {
        for step in [0, 2, 9] {
            let (r, p) = (
                score(rust.rubric(), &rust_task, reply, step).await,
                score(python.rubric(), &py_task, reply, step).await,
            );
            assert!((r - p).abs() < 1e-12, "{reply:?} at step {step}: rust {r}, python {p}");
        }
    }
}

#[tokio::test]
async fn a_python_tool_env_puts_calls_and_results_in_the_trace() {
    let h = serve("python", python_args("calculator.py", &json!({"num_examples": 10}))).await;
    let model = FakeModel::start(|r: &FakeRequest| {
        let question = r.messages.iter().find(|(role, _)| role == "user").map(|(_, c)| c.clone()).unwrap_or_default();
        match r.turn() {
            0 => {
                let expr = question.split("What is ").nth(1).and_then(|s| s.split('?').next()).unwrap().to_owned();
                FakeReply::ToolCalls(vec![(String::from("calculate"), json!({"expression": expr}).to_string())])
            }
            _ => FakeReply::Text(r.messages.last().unwrap().1.clone()),
        }
    })
    .await;
    let resp = h
        .client
        .run_group(pb::RunGroupRequest {
            example: example("train", 0),
            group_size: 2,
            actor: Some(actor(&model, "0")),
            ..Default::default()
        })
        .await
        .unwrap();
    for episode in &resp.episodes {
        let t = &episode.traces[0];
        assert!(t.errors.is_empty() && t.reward_errors.is_empty(), "{:?} {:?}", t.errors, t.reward_errors);
        let roles: Vec<&str> = t.nodes.iter().map(|n| n.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "assistant"]);
        assert_eq!(t.nodes[2].tool_calls[0].name, "calculate");
        assert_eq!(t.tools.len(), 1);
        assert!(t.tools[0].parameters_json.contains("\"expression\""), "schema from the signature");
        assert_eq!(t.stop_condition, "env_done");
        assert_eq!(t.rewards["correct"].score, 1.0);
        assert_eq!(t.rewards["used_tool"].score, 1.0);
        assert!((t.reward - 1.2).abs() < 1e-12);
        assert_eq!(t.metrics["tool_calls"], 1.0);
        let b = &branches(t)[0];
        let tool_text = t.nodes[3].content.as_bytes();
        let at = b
            .token_ids
            .windows(tool_text.len())
            .position(|w| w.iter().zip(tool_text).all(|(a, c)| *a == u32::from(*c)));
        assert!(at.is_some_and(|i| !b.mask[i]), "the tool result is context, not trained");
    }
}

#[tokio::test]
async fn bad_reward_functions_hanging_tools_and_crashes_are_per_trace_errors() {
    let dir = tempfile::tempdir().unwrap();
    let file = user_file(
        &dir,
        r#"
import asyncio, math, os, rl_env

async def hang():
    """Never returns."""
    await asyncio.sleep(3600)

def load_environment():
    def ok(completion): return 1.0
    def raises(answer): raise KeyError("missing")
    def nan(): return math.nan
    def text(): return "great"
    def crash(completion):
        if rl_env.last_reply(completion) == "crash":
            os._exit(3)
        return 0.0
    rubric = rl_env.Rubric([ok, raises, nan, text, crash])
    rows = [{"question": "fine"}, {"question": "hang"}, {"question": "crash"}]
    return rl_env.ToolEnv(dataset=rows, tools=[hang], tool_timeout_s=0.5, rubric=rubric, max_turns=3)
"#,
    );
    let h = serve("python", python_args(&file, &json!({}))).await;
    let model = FakeModel::start(|r: &FakeRequest| match r.last_user() {
        "hang" => FakeReply::ToolCalls(vec![(String::from("hang"), String::from("{}"))]),
        other => FakeReply::Text(other.to_owned()),
    })
    .await;
    let (model, h) = (&model, &h);
    let run = |index| async move {
        let request = pb::RunGroupRequest {
            example: example("train", index),
            group_size: 1,
            actor: Some(actor(model, "0")),
            ..Default::default()
        };
        h.client.run_group(request).await.unwrap().episodes.remove(0).traces.remove(0)
    };
    let traces = [run(0).await, run(1).await, run(2).await];
    // "fine": every function ran; the failing ones are named, score 0 and the rest count.
    let errors: Vec<(&str, &str)> =
        traces[0].reward_errors.iter().map(|e| (e.name.as_str(), e.message.as_str())).collect();
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(errors[0].0 == "raises" && errors[0].1.contains("raises raised KeyError"), "{errors:?}");
    assert!(errors[1].0 == "nan" && errors[1].1.contains("non-finite"), "{errors:?}");
    assert!(errors[2].0 == "text" && errors[2].1.contains("returned str 'great'"), "{errors:?}");
    assert_eq!(traces[0].reward, 1.0);
    // "hang": the tool hangs past its timeout: an env error on the trace, not a dead server.
    assert_eq!(traces[1].errors.len(), 1, "{:?}", traces[1]);
    assert!(traces[1].errors[0].message.contains("tool hang did not return within 0.5 s"), "{:?}", traces[1].errors);
    assert_eq!(traces[1].stop_condition, "error");
    // "crash": the worker died while scoring: a retryable reward error naming the exit.
    assert!(
        traces[2].reward_errors.iter().any(|e| e.message.contains("exit status: 3")),
        "{:?}",
        traces[2].reward_errors
    );
    // The worker is started again and the server keeps serving.
    let again = run(0).await;
    assert_eq!(again.reward, 1.0, "{again:?}");
}

/// A per-turn Python reward function: its mean is the reward component, its weighted scores the
/// trace's `turn_rewards`; a failing one leaves them empty.
#[tokio::test]
async fn a_python_per_turn_reward_function_fills_the_turn_rewards() {
    let dir = tempfile::tempdir().unwrap();
    let file = user_file(
        &dir,
        r#"
import rl_env

class Echo(rl_env.MultiTurnEnv):
    async def env_response(self, messages, state):
        return [{"role": "user", "content": "again"}]

def load_environment():
    def each_reply(completion):
        replies = [m["content"] for m in completion if m["role"] == "assistant"]
        if "fail" in replies:
            raise ValueError("cannot score")
        return [1.0 if r == "yes" else 0.0 for r in replies]
    rubric = rl_env.Rubric()
    rubric.add_reward_func(each_reply, 2.0, per_turn=True)
    rows = [{"question": "q"}, {"question": "fail"}]
    return Echo(dataset=rows, rubric=rubric, max_turns=3)
"#,
    );
    let h = serve("python", python_args(&file, &json!({}))).await;
    let model = FakeModel::start(|r: &FakeRequest| match (r.last_user(), r.turn()) {
        ("fail", _) => FakeReply::Text(String::from("fail")),
        (_, 1) => FakeReply::Text(String::from("no")),
        _ => FakeReply::Text(String::from("yes")),
    })
    .await;
    let run = |index| {
        let request = pb::RunGroupRequest {
            example: example("train", index),
            group_size: 1,
            actor: Some(actor(&model, "0")),
            ..Default::default()
        };
        let client = h.client.clone();
        async move { client.run_group(request).await.unwrap().episodes.remove(0).traces.remove(0) }
    };
    let t = run(0).await;
    assert!(t.errors.is_empty() && t.reward_errors.is_empty(), "{t:?}");
    assert_eq!(t.num_turns, 3);
    assert_eq!(t.turn_rewards, vec![2.0, 0.0, 2.0]);
    assert_eq!(t.rewards["each_reply"].score, 2.0 / 3.0);
    assert!((t.reward - 4.0 / 3.0).abs() < 1e-12);
    let failed = run(1).await;
    assert!(failed.turn_rewards.is_empty() && failed.reward == 0.0, "{failed:?}");
    assert!(failed.reward_errors[0].message.contains("cannot score"), "{:?}", failed.reward_errors);
}

#[tokio::test]
async fn load_errors_name_what_is_wrong() {
    let err = |args: Value| async move {
        rl_envs::load("python", args.as_object().unwrap()).await.err().map(|e| e.to_string()).unwrap_or_default()
    };
    let missing = err(json!({"file": "/nonexistent/env.py"})).await;
    assert!(missing.contains("env.args.file") && missing.contains("is not a file"), "{missing}");
    let both = err(json!({"file": "a.py", "module": "b"})).await;
    assert!(both.contains("exactly one of `file`"), "{both}");
    let no_python = err(json!({"module": "x", "python": "/nonexistent/python3"})).await;
    assert!(no_python.contains("env.args.python") && no_python.contains("cannot start"), "{no_python}");
    let dir = tempfile::tempdir().unwrap();
    let file = user_file(&dir, "def load_environment(size):\n    raise RuntimeError(f'no data of size {size}')\n");
    let failed = err(python_args(&file, &json!({"size": 3}))).await;
    assert!(failed.contains("RuntimeError: no data of size 3"), "{failed}");
    let no_sdk = err(json!({"file": file})).await;
    assert!(no_sdk.contains("No module named") || no_sdk.contains("rl-env package"), "{no_sdk}");
    let bad_row = user_file(
        &dir,
        "import rl_env\ndef load_environment():\n    return rl_env.SingleTurnEnv(dataset=[{'q': 1}])\n",
    );
    let row = err(python_args(&bad_row, &json!({}))).await;
    assert!(row.contains("train row 0: has no 'question' field"), "{row}");
}

#[tokio::test]
async fn a_python_reward_function_asks_the_judge_model_of_the_request() {
    let dir = tempfile::tempdir().unwrap();
    let file = user_file(
        &dir,
        r#"
import rl_env

def load_environment():
    async def judged(completion, models):
        verdict = await models["judge"].chat([{"role": "user", "content": "Polite? " + rl_env.last_reply(completion)}])
        return 1.0 if verdict.strip() == "yes" else 0.0
    rows = [{"question": "please greet me"}, {"question": "insult me"}]
    return rl_env.SingleTurnEnv(dataset=rows, rubric=rl_env.Rubric([judged]))
"#,
    );
    let h = serve("python", python_args(&file, &json!({}))).await;
    let model = FakeModel::start(|r: &FakeRequest| match r.body["model"].as_str() {
        Some("judge") => FakeReply::Text(String::from(if r.last_user().contains("hello") { "yes" } else { "no" })),
        _ => FakeReply::Text(String::from(if r.last_user().contains("greet") { "hello there" } else { "go away" })),
    })
    .await;
    let judge =
        pb::ModelRuntime { base_url: model.base_url.clone(), model: String::from("judge"), ..Default::default() };
    for (index, expected) in [(0, 1.0), (1, 0.0)] {
        let request = pb::RunGroupRequest {
            example: example("train", index),
            group_size: 1,
            actor: Some(actor(&model, "0")),
            models: [(String::from("judge"), judge.clone())].into(),
            ..Default::default()
        };
        let t = h.client.run_group(request).await.unwrap().episodes.remove(0).traces.remove(0);
        assert_eq!((t.reward, t.reward_errors.len()), (expected, 0), "{t:?}");
    }
}

#[tokio::test]
async fn a_python_env_registers_its_own_advantage_algorithm() {
    let dir = tempfile::tempdir().unwrap();
    let file = user_file(
        &dir,
        r#"
import rl_env

def load_environment():
    def length(completion):
        return len(rl_env.last_reply(completion))
    def centered(traces, fields):
        scale = fields.get("scale", 1.0)
        rewards = [t["reward"] for t in traces if not t["failed"]]
        mean = sum(rewards) / len(rewards)
        return [None if t["failed"] else scale * (t["reward"] - mean) for t in traces]
    return rl_env.SingleTurnEnv(dataset=[{"question": "q"}], rubric=rl_env.Rubric([length]), algorithms=[centered])
"#,
    );
    let h = serve("python", python_args(&file, &json!({}))).await;
    // Replies of 1, 2 and 6 characters (by the seed of each rollout in the group).
    let model = FakeModel::start(|r: &FakeRequest| {
        FakeReply::Text("abcdef"[..[1, 2, 6][r.body["seed"].as_u64().unwrap_or(7) as usize - 7]].to_owned())
    })
    .await;
    let request = pb::RunGroupRequest {
        example: example("train", 0),
        group_size: 3,
        actor: Some(actor(&model, "0")),
        ..Default::default()
    };
    let traces: Vec<pb::Trace> =
        h.client.run_group(request).await.unwrap().episodes.into_iter().map(|mut e| e.traces.remove(0)).collect();
    let info = h.client.info().await.unwrap();
    assert!(info.algorithms.contains(&String::from("centered")) && info.algorithms.contains(&String::from("rloo")));
    let spec = pb::AlgorithmSpec { id: String::from("centered"), fields_json: String::from(r#"{"scale": 2.0}"#) };
    let request = pb::RunAlgorithmsRequest { algorithms: vec![spec], traces: traces.clone(), ..Default::default() };
    let resp = h.client.run_algorithms(request).await.unwrap();
    // Rewards 1, 2, 6 (mean 3), scaled by 2: -4, -2, 6 on every sampled token.
    for (trace, (out, want)) in traces.iter().zip(resp.traces.iter().zip([-4.0f32, -2.0, 6.0])) {
        let b = &branches(trace)[0];
        let o = &out.branches[0];
        assert_eq!(o.mask, b.mask);
        assert!(o.advantages.iter().zip(&o.mask).all(|(a, m)| *a == if *m { want } else { 0.0 }), "{o:?}");
    }
}
