//! Integration tests of rl-serve over real gRPC on 127.0.0.1: per-request training context under
//! concurrency, malformed requests, rollout errors, RunAlgorithms, cancellation.

mod algorithms;
mod errors;
mod hostile;
mod https;
mod judge;
mod training_context;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rl_configs::ServeConfig;
use rl_serve::fake_model::{FakeModel, FakeReply, FakeRequest};
use rl_serve::{
    ClientOptions, EnvClient, EnvReply, Environment, Message, Result, Rubric, RubricGroup, ScoringContext, State, Task,
    check_index, pb, reward_fn,
};
use serde_json::{Value, json};

/// A single-turn env whose reward depends on the training step (inside a `RubricGroup`, next to a
/// second rubric), so tests can see which context each rollout was scored with.
pub(crate) struct StepEnv {
    rubric: RubricGroup,
}

impl StepEnv {
    pub(crate) fn new() -> Self {
        let step_reward =
            Rubric::new().reward(reward_fn("step", |ctx: &ScoringContext<'_>| Ok(ctx.step() as f64)), 1.0);
        let has_context = Rubric::new()
            .metric(reward_fn("has_context", |ctx: &ScoringContext<'_>| {
                Ok(f64::from(u8::from(ctx.training_context.is_some())))
            }))
            .metric(reward_fn("fails", |_: &ScoringContext<'_>| Err(String::from("this metric always fails"))));
        StepEnv { rubric: RubricGroup::new(vec![step_reward, has_context]) }
    }
}

#[async_trait]
impl Environment for StepEnv {
    fn id(&self) -> &str {
        "step-env"
    }
    fn splits(&self) -> Vec<(String, u64)> {
        vec![(String::from("train"), 10)]
    }
    fn task(&self, split: &str, index: u64) -> Result<Task> {
        check_index(split, &["train"], index, 10)?;
        Ok(Task { key: format!("{split}/{index}"), data: json!({"q": index}) })
    }
    fn inline_task(&self, data: Value) -> Result<Task> {
        Ok(Task { key: String::from("inline"), data })
    }
    async fn prompt(&self, task: &Task) -> Result<Vec<Message>> {
        Ok(vec![Message::user(task.data.to_string())])
    }
    async fn env_response(&self, _: &Task, _: &mut State) -> Result<EnvReply> {
        Ok(EnvReply::Done)
    }
    fn rubric(&self) -> &RubricGroup {
        &self.rubric
    }
}

/// A server on 127.0.0.1:0 with a client; stops when dropped.
pub(crate) struct Harness {
    pub(crate) client: EnvClient,
    _stop: tokio::sync::oneshot::Sender<()>,
}

pub(crate) async fn start(env: Arc<dyn Environment>, config: ServeConfig, options: ClientOptions) -> Harness {
    let listener = rl_serve::bind(&config).await.expect("bind");
    let addr = listener.local_addr().unwrap();
    assert!(addr.ip().is_loopback(), "binds loopback by default");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        rl_serve::serve(env, &config, listener, async {
            let _ = rx.await;
        })
        .await
        .expect("serve");
    });
    let client = EnvClient::new(&addr.to_string(), options).unwrap();
    client.wait_for_health(Duration::from_secs(10)).await.unwrap();
    Harness { client, _stop: tx }
}

pub(crate) async fn echo_model() -> FakeModel {
    FakeModel::start(|r: &FakeRequest| FakeReply::Text(format!("echo {}", r.last_user()))).await
}

pub(crate) fn actor(model: &FakeModel) -> pb::ModelRuntime {
    pb::ModelRuntime {
        base_url: model.base_url.clone(),
        model: String::from("fake"),
        tokens: true,
        sampling: Some(pb::SamplingArgs { temperature: Some(1.0), ..Default::default() }),
        ..Default::default()
    }
}

pub(crate) fn dataset(split: &str, index: u64) -> Option<pb::ExampleRef> {
    Some(pb::ExampleRef {
        source: Some(pb::example_ref::Source::Dataset(pb::DatasetIndex { split: split.to_owned(), index })),
    })
}
