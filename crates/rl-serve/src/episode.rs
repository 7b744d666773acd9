//! What one episode carries: the request it runs for (task, actor, training context, extra
//! models) and its mutable state (messages, turns, the environment's own data).

use std::collections::BTreeMap;

use serde_json::Value;

use crate::pb;
use crate::types::{Message, ModelRuntime, Task};

/// Everything one episode needs besides the environment.
#[derive(Debug, Clone, Copy)]
pub struct RolloutRequest<'a> {
    /// The task.
    pub task: &'a Task,
    /// The acting model.
    pub actor: &'a ModelRuntime,
    /// Position in its group (offsets the sampling seed).
    pub index: u32,
    /// The request's training context (the wire form is echoed back on the trace).
    pub training_context: Option<&'a pb::TrainingContext>,
    /// The request's extra models by key (for judges in the rubric).
    pub models: &'a BTreeMap<String, ModelRuntime>,
}

/// Mutable state of one episode, owned by that episode only.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct State {
    /// The conversation so far, prompt included.
    pub messages: Vec<Message>,
    /// Model turns taken.
    pub turns: u32,
    /// Free-form data an environment keeps between turns.
    pub data: BTreeMap<String, Value>,
}
