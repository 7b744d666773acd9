//! The orchestrator: the algorithm registry (per-branch channels, dimension checks, same-loss
//! aggregation; trace-level, model-scored and env-owned algorithms), the train sink (traces to
//! training samples, packing into rows), and `Orchestrator`, which runs the dispatch loop with
//! bounded staleness, the weight watcher, checkpoints with resume, and online evaluation.
//!
//! Depends on rl-configs, rl-proto and rl-serve (client side); it must never depend on candle.

mod algorithms;
mod checkpoint;
mod error;
mod eval;
mod run;
mod scoring;
mod sink;

pub use algorithms::{Algorithm, BranchTargets, Channel, aggregate, rae_channels};
pub use checkpoint::{OrchestratorState, checkpoint_steps, clean_after, state_path};
pub use error::{Error, Result};
pub use eval::{SOLVED, eval_metrics, pass_at_k};
pub use run::{Orchestrator, StepSummary, write_batch};
pub use scoring::{Endpoint, root_url};
pub use sink::{TrainingSample, pack, samples};
