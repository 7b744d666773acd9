//! A full reverse-text group: perfect, partial and malformed answers; tokens, masks, logprobs.

use rl_serve::fake_model::{END, FakeModel, FakeReply, FakeRequest, TOKEN_LOGPROB, render};
use rl_serve::{branches, pb};
use serde_json::json;

use crate::{Harness, actor, example, ids, serve};

#[tokio::test]
async fn a_group_carries_tokens_masks_logprobs_and_difflib_rewards() {
    let h = serve("reverse-text", json!({"num_examples": 20, "min_len": 5, "max_len": 10, "seed": 1})).await;
    check_group(&h).await;
}

#[tokio::test]
async fn the_format_penalty_ramps_with_the_step_of_each_request() {
    let h = serve("reverse-text", json!({"num_examples": 5, "format_penalty": 0.5, "penalty_warmup_steps": 10})).await;
    check_penalty(&h).await;
}

/// The trace checks of a reverse-text group (shared with the Python reverse-text).
pub(crate) async fn check_group(h: &Harness) {
    // Choice quality depends on the seed the env derives per rollout (base 7 + index).
    let model = FakeModel::start(|r: &FakeRequest| {
        let text = r.last_user();
        let reversed: String = text.chars().rev().collect();
        FakeReply::Text(match r.body["seed"].as_u64().unwrap_or(0) {
            7 => format!("<reversed_text>{reversed}</reversed_text>"),
            8 => format!("<reversed_text>{}</reversed_text>", &reversed[..reversed.len() / 2]),
            _ => reversed,
        })
    })
    .await;
    let resp = h
        .client
        .run_group(pb::RunGroupRequest {
            example: example("train", 4),
            group_size: 3,
            actor: Some(actor(&model, "5")),
            training_context: Some(pb::TrainingContext { step: 6, policy_version: 5, ..Default::default() }),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(resp.episodes.len(), 3);
    let rewards: Vec<f64> = resp.episodes.iter().map(|e| e.traces[0].reward).collect();
    assert_eq!(rewards[0], 1.0, "exact reversal in tags");
    assert!(rewards[1] > 0.0 && rewards[1] < 1.0, "half the answer: {}", rewards[1]);
    assert_eq!(rewards[2], 0.0, "no tags");

    let trace = &resp.episodes[0].traces[0];
    assert_eq!(trace.stop_condition, "env_done");
    assert_eq!(trace.num_turns, 1);
    let roles: Vec<&str> = trace.nodes.iter().map(|n| n.role.as_str()).collect();
    assert_eq!(roles, ["system", "user", "assistant"]);
    let user = &trace.nodes[1].content;
    let messages = vec![
        (String::from("system"), rl_envs::REVERSE_TEXT_SYSTEM_PROMPT.to_owned()),
        (String::from("user"), user.clone()),
    ];
    let prompt = ids(&render(&messages));
    let reversed: String = user.chars().rev().collect();
    let completion = ids(&format!("<reversed_text>{reversed}</reversed_text>{END}"));
    let b = &branches(trace)[0];
    assert_eq!(b.token_ids, [prompt.clone(), completion.clone()].concat());
    assert_eq!(b.mask.iter().filter(|m| **m).count(), completion.len());
    assert!(b.mask[..prompt.len()].iter().all(|m| !m), "prompt tokens are not trained");
    assert!(b.logprobs[prompt.len()..].iter().all(|l| *l == TOKEN_LOGPROB));

    let sent = model.requests();
    assert!(sent.iter().all(|r| r["cache_salt"] == "5" && r["return_token_ids"] == true && r["logprobs"] == true));
    assert!(sent.iter().all(|r| r["max_completion_tokens"] == 200));
}

/// The step-aware format penalty (0.5 over 10 warm-up steps), shared with the Python reverse-text.
pub(crate) async fn check_penalty(h: &Harness) {
    let model = FakeModel::start(|r: &FakeRequest| {
        let reversed: String = r.last_user().chars().rev().collect();
        FakeReply::Text(format!("Sure! <reversed_text>{reversed}</reversed_text>"))
    })
    .await;
    for (context, scale) in [(None, 0.0), (Some(0u64), 0.0), (Some(4), 0.2), (Some(10), 0.5), (Some(30), 0.5)] {
        let resp = h
            .client
            .run_group(pb::RunGroupRequest {
                example: example("test", 1),
                group_size: 1,
                actor: Some(actor(&model, "0")),
                training_context: context.map(|step| pb::TrainingContext { step, ..Default::default() }),
                ..Default::default()
            })
            .await
            .unwrap();
        let t = &resp.episodes[0].traces[0];
        assert_eq!(t.metrics["format_penalty_scale"], scale, "step {context:?}");
        assert_eq!(t.rewards["format_penalty"].score, -scale);
        assert!((t.reward - (1.0 - scale)).abs() < 1e-12, "step {context:?}: reward {}", t.reward);
    }
}
