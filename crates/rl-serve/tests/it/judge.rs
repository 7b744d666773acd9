//! LLM-judge rubrics: a reward function asks one of the request's `models` (here the scripted
//! server under the name `judge`) and scores by its verdict; a missing judge is a reward error.

use std::sync::Arc;

use async_trait::async_trait;
use rl_configs::ServeConfig;
use rl_serve::fake_model::{FakeModel, FakeReply, FakeRequest};
use rl_serve::{
    ClientOptions, EnvReply, Environment, Message, Result, RewardFn, Rubric, RubricGroup, ScoringContext, State, Task,
    check_index, pb,
};
use serde_json::{Value, json};

use crate::{actor, dataset, start};

struct Judged;

#[async_trait]
impl RewardFn for Judged {
    fn name(&self) -> &str {
        "judged"
    }

    async fn score(&self, ctx: &ScoringContext<'_>) -> std::result::Result<f64, String> {
        let question = format!("Is this answer polite? Say yes or no.\n{}", ctx.last_reply());
        let verdict = ctx.ask("judge", &[Message::user(question)]).await?;
        Ok(f64::from(u8::from(verdict.trim() == "yes")))
    }
}

struct JudgeEnv(RubricGroup);

#[async_trait]
impl Environment for JudgeEnv {
    fn id(&self) -> &str {
        "judge-env"
    }
    fn splits(&self) -> Vec<(String, u64)> {
        vec![(String::from("train"), 2)]
    }
    fn task(&self, split: &str, index: u64) -> Result<Task> {
        check_index(split, &["train"], index, 2)?;
        Ok(Task { key: format!("{split}/{index}"), data: json!({"q": index}) })
    }
    fn inline_task(&self, data: Value) -> Result<Task> {
        Ok(Task { key: String::from("inline"), data })
    }
    async fn prompt(&self, task: &Task) -> Result<Vec<Message>> {
        Ok(vec![Message::user(if task.data["q"] == 0 { "please greet me" } else { "insult me" })])
    }
    async fn env_response(&self, _: &Task, _: &mut State) -> Result<EnvReply> {
        Ok(EnvReply::Done)
    }
    fn rubric(&self) -> &RubricGroup {
        &self.0
    }
}

/// The actor greets or insults; the judge (same server, model `judge`) says whether it was polite.
async fn actor_and_judge() -> FakeModel {
    FakeModel::start(|r: &FakeRequest| match r.body["model"].as_str() {
        Some("judge") => FakeReply::Text(String::from(if r.last_user().contains("hello") { "yes" } else { "no" })),
        _ => FakeReply::Text(String::from(if r.last_user().contains("greet") { "hello there" } else { "go away" })),
    })
    .await
}

#[tokio::test]
async fn a_rust_reward_function_asks_the_judge_model_of_the_request() {
    let env = Arc::new(JudgeEnv(RubricGroup::new(vec![Rubric::new().reward(Arc::new(Judged), 1.0)])));
    let h = start(env, ServeConfig::default(), ClientOptions::default()).await;
    let model = actor_and_judge().await;
    let judge =
        pb::ModelRuntime { base_url: model.base_url.clone(), model: String::from("judge"), ..Default::default() };
    for (index, expected) in [(0, 1.0), (1, 0.0)] {
        let request = pb::RunGroupRequest {
            example: dataset("train", index),
            group_size: 1,
            actor: Some(actor(&model)),
            models: [(String::from("judge"), judge.clone())].into(),
            ..Default::default()
        };
        let t = h.client.run_group(request).await.unwrap().episodes.remove(0).traces.remove(0);
        assert_eq!((t.reward, t.reward_errors.len()), (expected, 0), "{t:?}");
    }
    let without = pb::RunGroupRequest {
        example: dataset("train", 0),
        group_size: 1,
        actor: Some(actor(&model)),
        ..Default::default()
    };
    let t = h.client.run_group(without).await.unwrap().episodes.remove(0).traces.remove(0);
    assert!(t.reward_errors[0].message.contains("the request has no model \"judge\""), "{t:?}");
}
