//! The environment server: the `Environment` and `Rubric` abstractions, the rollout loop (and the
//! multi-agent kernel: members, slots, public/private channels, `MARScore`), the gRPC
//! service (`EnvService`, `serve`), the orchestrator's `EnvClient`, and an OpenAI-compatible
//! `ModelClient` that environments sample through.
//!
//! Depends on rl-proto and rl-configs; it must never depend on candle (models are reached over HTTP).

mod algorithms;
mod client;
mod env;
mod episode;
mod error;
#[cfg(feature = "fake-model")]
pub mod fake_model;
pub mod http;
mod model_client;
mod multi_agent;
mod multi_rollout;
mod rollout;
mod rubric;
mod server;
mod standalone;
mod trace;
mod types;

pub use algorithms::{BranchOutput, EnvAlgorithm, Rloo, default_algorithms, on_sampled_tokens};
pub use client::{ClientOptions, EnvClient};
pub use env::{EnvReply, Environment, EpisodeRunner, check_index};
pub use episode::{RolloutRequest, State};
pub use error::{Error, Result};
pub use model_client::{ChatResponse, Choice, ModelClient};
pub use multi_agent::{Kernel, MARScore, MultiAgent, ProtocolError, Turn, split_channels};
pub use multi_rollout::run_multi_agent_episode;
pub use rl_proto::env::v1 as pb;
pub use rollout::run_episode;
pub use rubric::{
    BatchFunction, BatchRewardFn, FnReward, NO_MODELS, RewardFn, Rubric, RubricGroup, Scored, Scores, ScoringContext,
    TurnRewardFn, reward_fn, turn_reward_fn,
};
pub use server::{DRAIN_TIMEOUT, EnvService, MAX_GROUP_SIZE, bind, serve};
pub use standalone::{StandaloneError, announce_and_serve, env_server_main, shutdown_signal};
pub use trace::{Branch, branches, check_trace};
pub use types::{
    ApiKey, DEFAULT_MODEL_TIMEOUT, Message, ModelRuntime, RequestContext, Role, Sampling, Task, ToolCall, ToolSpec,
    TrainingContext,
};
