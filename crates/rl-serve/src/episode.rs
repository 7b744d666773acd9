//! What one episode carries: the request it runs for (task, actor, training context, extra
//! models) and its mutable state (messages, turns, the environment's own data).

use std::collections::BTreeMap;

use serde_json::Value;

use crate::types::{Message, ModelRuntime, RequestContext, Task};

/// Everything one episode needs besides the environment.
#[derive(Debug, Clone, Copy)]
pub struct RolloutRequest<'a> {
    /// The task.
    pub task: &'a Task,
    /// The acting model.
    pub actor: &'a ModelRuntime,
    /// Position in its group (offsets the sampling seed).
    pub index: u32,
    /// The request's training context, decoded, with its wire form to echo back on the traces.
    pub training_context: Option<&'a RequestContext>,
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
