//! The orchestrator: samples tasks, runs groups of rollouts on env servers (`dispatch`), turns
//! them into per-token training targets with each env's algorithms (`algorithms`), packs training
//! samples (`sink`) and writes each step's batch (`writer`); keeps the inference server's weights
//! current (`policy`), checkpoints and resumes, and evaluates online (`eval`). `Orchestrator` runs
//! the loop.
//!
//! Depends on rl-configs, rl-proto and rl-serve (client side); it must never depend on candle.

mod algorithms;
mod checkpoint;
mod curriculum;
mod dispatch;
mod envs;
mod error;
mod eval;
mod metrics;
mod models;
mod orchestrator;
mod policy;
mod rollout;
mod sampler;
mod seq_len;
mod sink;
mod task_rate;
mod writer;

pub use algorithms::{
    Algorithm, BranchTargets, Channel, Echo, EnvInfo, EnvOwned, Grpo, HierarchicalGrpo, MaxRl, Opd, Opsd, Rae, Rft, Rl,
    Scoring, Sft, aggregate, build as build_algorithm,
};
pub use checkpoint::{OrchestratorState, checkpoint_steps, clean_after};
pub use curriculum::Curriculum;
pub use dispatch::GROUP_ATTEMPTS;
pub use error::{Error, Result};
pub use eval::{SOLVED, eval_metrics, pass_at_k};
pub use metrics::{Stats, stats};
pub use models::{Endpoint, Models, root_url};
pub use orchestrator::{Orchestrator, StepSummary};
pub use rollout::{Group, Rollout};
pub use sampler::{EnvShape, Planned, Sampler};
pub use sink::{TrainingSample, pack, samples};
pub use writer::{write_batch, write_eval_traces, write_traces};
