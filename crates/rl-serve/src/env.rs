//! The `Environment` trait: a dataset of tasks per split, the prompt of a task, the environment's
//! replies between model turns, tools, and the rubric that scores an episode.

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde_json::Value;

use crate::episode::State;
use crate::error::Result;
use crate::pb;
use crate::rubric::RubricGroup;
use crate::types::{Message, Task, ToolSpec};

/// What the environment does after a model turn.
#[derive(Debug, Clone, PartialEq)]
pub enum EnvReply {
    /// The episode is over.
    Done,
    /// Continue: these messages (user feedback, tool results) go to the model next.
    Continue(Vec<Message>),
}

/// An environment: tasks, how an episode unfolds, and how it is scored.
#[async_trait]
pub trait Environment: Send + Sync + 'static {
    /// Environment id (e.g. `reverse-text`).
    fn id(&self) -> &str;

    /// Dataset splits and their sizes.
    fn splits(&self) -> Vec<(String, u64)>;

    /// The task at `index` of `split`; a bad split or index is a `BadRequest` naming the field.
    fn task(&self, split: &str, index: u64) -> Result<Task>;

    /// A task sent inline, in the env's task format.
    fn inline_task(&self, data: Value) -> Result<Task>;

    /// The first messages of an episode.
    async fn prompt(&self, task: &Task) -> Result<Vec<Message>>;

    /// Tools offered to the model.
    fn tools(&self, _task: &Task) -> Vec<ToolSpec> {
        Vec::new()
    }

    /// Most model turns in an episode.
    fn max_turns(&self, _task: &Task) -> u32 {
        1
    }

    /// Called after each model turn (the reply is the last message of `state.messages`).
    async fn env_response(&self, task: &Task, state: &mut State) -> Result<EnvReply>;

    /// The rubric scoring an episode.
    fn rubric(&self) -> &RubricGroup;

    /// Free-form facts for `Info`.
    fn metadata(&self) -> BTreeMap<String, String> {
        BTreeMap::new()
    }

    /// Advantage algorithms this env offers through `RunAlgorithms`, next to the server's
    /// built-in ones (an env's algorithm replaces a built-in of the same id).
    fn algorithms(&self) -> Vec<std::sync::Arc<dyn crate::algorithms::EnvAlgorithm>> {
        Vec::new()
    }

    /// A multi-agent environment returns its member model here; its episodes then run through
    /// the multi-agent kernel (one trace per member) instead of `env_response`.
    fn multi_agent(&self) -> Option<&dyn crate::multi_agent::MultiAgent> {
        None
    }

    /// An environment that runs whole episodes itself (another framework's machinery, e.g. a
    /// verifiers environment) returns its runner here; its episodes then bypass the turn loop,
    /// `env_response` and the rubric.
    fn episode_runner(&self) -> Option<&dyn EpisodeRunner> {
        None
    }
}

/// Runs whole episodes: the model calls, the turn loop, stop conditions and scoring all happen
/// inside (the server still bounds, times out and cancels them as any episode).
#[async_trait]
pub trait EpisodeRunner: Send + Sync {
    /// The traces of one episode of `req.task`: at least one, every failure recorded on a trace
    /// (kind and retryable), never an empty list. The server fills `task_json`, `task_key` and
    /// `scored_with`.
    async fn run_episode(&self, req: crate::episode::RolloutRequest<'_>) -> Vec<pb::Trace>;
}

/// Looks up `index` in a split of `len` tasks, with the errors every env gives.
pub fn check_index(split: &str, known: &[&str], index: u64, len: u64) -> Result<()> {
    if !known.contains(&split) {
        return Err(crate::error::Error::bad_request(
            "example.dataset.split",
            format!("unknown split {split:?}; this env has {}", known.join(", ")),
        ));
    }
    if index >= len {
        return Err(crate::error::Error::bad_request(
            "example.dataset.index",
            format!("index {index} is out of range for split {split:?} of {len} tasks"),
        ));
    }
    Ok(())
}
