//! A full alphabet-sort episode: several turns on one branch, env turns not trained.

use rl_serve::fake_model::{FakeModel, FakeReply, FakeRequest};
use rl_serve::{branches, pb};
use serde_json::json;

use crate::{actor, example, serve};

/// Answers with the ground truth of each turn, read from the task the test fetched.
#[tokio::test]
async fn a_multi_turn_episode_is_one_branch_with_only_model_tokens_trained() {
    let args = json!({"num_examples": 10, "min_turns": 3, "max_turns": 3, "min_names": 1, "max_names": 3, "seed": 2});
    let h = serve("alphabet-sort", args.clone()).await;
    let env = rl_envs::load("alphabet-sort", args.as_object().unwrap()).await.unwrap();
    let task = env.task("train", 2).unwrap();
    let truths: Vec<Vec<String>> = serde_json::from_value(task.data["ground_truths"].clone()).unwrap();
    let answers = truths.clone();
    let model = FakeModel::start(move |r: &FakeRequest| {
        let t = r.turn();
        let tag = if t == 0 { "alphabetical_sorted" } else { "combined_alphabetical_sorted" };
        FakeReply::Text(format!("<{tag}>\n{}\n</{tag}>", answers[t].join("\n")))
    })
    .await;
    let resp = h
        .client
        .run_rollout(pb::RunRolloutRequest {
            example: example("train", 2),
            actor: Some(actor(&model, "1")),
            ..Default::default()
        })
        .await
        .unwrap();
    let trace = &resp.episode.unwrap().traces[0];
    assert!(trace.errors.is_empty(), "{:?}", trace.errors);
    assert_eq!(trace.num_turns, 3);
    assert_eq!(trace.reward, 1.0);
    assert_eq!(trace.turn_rewards, vec![1.0; 3], "each turn scored on its own");
    assert_eq!(trace.stop_condition, "env_done");
    let roles: Vec<&str> = trace.nodes.iter().map(|n| n.role.as_str()).collect();
    assert_eq!(roles, ["user", "assistant", "user", "assistant", "user", "assistant"]);
    let bs = branches(trace);
    assert_eq!(bs.len(), 1, "each prompt extends the previous one");
    for node in &trace.nodes {
        assert_eq!(node.sampled, node.role == "assistant");
        assert!(node.mask.iter().all(|m| *m == node.sampled), "only sampled tokens are trained");
        assert_eq!(node.logprobs.len(), if node.sampled { node.token_ids.len() } else { 0 });
    }
    assert_eq!(model.requests().len(), 3);

    let wrong = FakeModel::start(|_: &FakeRequest| {
        FakeReply::Text(String::from("<alphabetical_sorted>\nNobody\n</alphabetical_sorted>"))
    })
    .await;
    let resp = h
        .client
        .run_rollout(pb::RunRolloutRequest {
            example: example("train", 2),
            actor: Some(actor(&wrong, "1")),
            ..Default::default()
        })
        .await
        .unwrap();
    let trace = &resp.episode.unwrap().traces[0];
    assert!(trace.reward < 0.2);
    // The first turn's tag is there (a poor sort), later turns lack theirs: 0. The reward is the
    // turns' mean.
    assert_eq!(trace.turn_rewards.len(), 3);
    assert!(trace.turn_rewards[0] > 0.0 && trace.turn_rewards[1..] == [0.0, 0.0], "{:?}", trace.turn_rewards);
    assert!((trace.reward - trace.turn_rewards.iter().sum::<f64>() / 3.0).abs() < 1e-12);
}

/// A conversation that outgrows the model's context after its first turn ends as
/// `prompt_too_long` and is kept: no error, the first turn scored and trainable (as verifiers
/// does). Every call of the episode carries the same `X-Session-ID`, the trace's id.
#[tokio::test]
async fn an_episode_that_outgrows_the_context_is_kept_with_its_turns() {
    let args = json!({"num_examples": 10, "min_turns": 3, "max_turns": 3, "min_names": 1, "max_names": 3, "seed": 2});
    let h = serve("alphabet-sort", args.clone()).await;
    let env = rl_envs::load("alphabet-sort", args.as_object().unwrap()).await.unwrap();
    let truths: Vec<Vec<String>> =
        serde_json::from_value(env.task("train", 2).unwrap().data["ground_truths"].clone()).unwrap();
    let sessions = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = sessions.clone();
    let model = FakeModel::start(move |r: &FakeRequest| {
        seen.lock().unwrap().push(r.headers.get("x-session-id").cloned().unwrap_or_default());
        if r.turn() == 0 {
            FakeReply::Text(format!("<alphabetical_sorted>\n{}\n</alphabetical_sorted>", truths[0].join("\n")))
        } else {
            FakeReply::Error(400, String::from("This model's maximum context length is 64 tokens"))
        }
    })
    .await;
    let req =
        pb::RunRolloutRequest { example: example("train", 2), actor: Some(actor(&model, "1")), ..Default::default() };
    let trace = h.client.run_rollout(req).await.unwrap().episode.unwrap().traces[0].clone();
    assert!(trace.errors.is_empty(), "{:?}", trace.errors);
    assert_eq!(trace.stop_condition, "prompt_too_long");
    assert_eq!(trace.num_turns, 1);
    assert!(!trace.rewards.is_empty(), "scored");
    // The turns the model never reached score 0.
    assert_eq!(trace.turn_rewards, vec![1.0, 0.0, 0.0]);
    assert!(trace.nodes.iter().any(|n| n.sampled && n.mask.iter().any(|m| *m)), "its turn trains");
    let sessions = sessions.lock().unwrap().clone();
    assert_eq!(sessions.len(), 2);
    assert!(sessions.iter().all(|s| s == &trace.id), "{sessions:?} vs {}", trace.id);
}

/// With `history = "gold"` the earlier turns arrive answered with their ground truth (as the SFT
/// conversations answer them) and the model answers, and is scored on, the last turn only.
#[tokio::test]
async fn gold_history_episodes_ask_for_the_last_turn_only() {
    let args = json!({"num_examples": 10, "min_turns": 3, "max_turns": 3, "min_names": 1, "max_names": 3,
        "seed": 2, "history": "gold"});
    let h = serve("alphabet-sort", args.clone()).await;
    let env = rl_envs::load("alphabet-sort", args.as_object().unwrap()).await.unwrap();
    let task = env.task("train", 2).unwrap();
    let truths: Vec<Vec<String>> = serde_json::from_value(task.data["ground_truths"].clone()).unwrap();
    let users: Vec<String> = serde_json::from_value(task.data["user_turns"].clone()).unwrap();
    let (expected_users, expected_truths) = (users.clone(), truths.clone());
    let model = FakeModel::start(move |r: &FakeRequest| {
        let roles: Vec<&str> = r.messages.iter().map(|(role, _)| role.as_str()).collect();
        assert_eq!(roles, ["user", "assistant", "user", "assistant", "user"], "two answered turns, then the third");
        assert_eq!(r.messages[2].1, expected_users[1]);
        let gold = &r.messages[3].1;
        assert_eq!(
            gold,
            &format!(
                "<combined_alphabetical_sorted>\n{}\n</combined_alphabetical_sorted>",
                expected_truths[1].join("\n")
            )
        );
        FakeReply::Text(format!(
            "<combined_alphabetical_sorted>\n{}\n</combined_alphabetical_sorted>",
            expected_truths[2].join("\n")
        ))
    })
    .await;
    let req =
        pb::RunRolloutRequest { example: example("train", 2), actor: Some(actor(&model, "1")), ..Default::default() };
    let trace = h.client.run_rollout(req).await.unwrap().episode.unwrap().traces[0].clone();
    assert!(trace.errors.is_empty(), "{:?}", trace.errors);
    assert_eq!(trace.num_turns, 1, "one model turn");
    assert_eq!(trace.stop_condition, "env_done");
    assert_eq!(trace.reward, 1.0);
    assert_eq!(trace.turn_rewards, vec![1.0], "only the model's turn is scored");
    let sampled: Vec<_> = trace.nodes.iter().filter(|n| n.sampled).collect();
    assert_eq!(sampled.len(), 1);
    assert!(
        trace.nodes.iter().filter(|n| !n.sampled).all(|n| n.mask.iter().all(|m| !*m)),
        "gold answers are not trained"
    );
    assert_eq!(model.requests().len(), 1);
    assert!(users[2].contains("Follow the same format"), "the third turn of the episode: {}", users[2]);

    // A wrong last answer is not rescued by the gold turns before it.
    let wrong = FakeModel::start(|_: &FakeRequest| {
        FakeReply::Text(String::from("<combined_alphabetical_sorted>\nNobody\n</combined_alphabetical_sorted>"))
    })
    .await;
    let req =
        pb::RunRolloutRequest { example: example("train", 2), actor: Some(actor(&wrong, "2")), ..Default::default() };
    let trace = h.client.run_rollout(req).await.unwrap().episode.unwrap().traces[0].clone();
    assert_eq!(trace.turn_rewards.len(), 1);
    assert!(trace.reward < 0.05, "{}", trace.reward);
}

#[tokio::test]
async fn an_unknown_history_is_refused_by_name() {
    let args = json!({"history": "teacher"});
    let Err(err) = rl_envs::load("alphabet-sort", args.as_object().unwrap()).await else {
        panic!("history = \"teacher\" was accepted");
    };
    let err = err.to_string();
    assert!(err.contains("env.args.history") && err.contains("model, gold"), "{err}");
}
