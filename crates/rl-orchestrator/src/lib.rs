//! The orchestrator's core: the algorithm registry (per-branch channels, dimension checks,
//! same-loss aggregation) and the train sink (traces to training samples, packing into rows).
//! `Orchestrator` runs the dispatch loop with bounded staleness and the weight watcher. Not built
//! yet: orchestrator checkpoints, online evaluation, env-owned algorithms.
//!
//! Depends on rl-configs, rl-proto and rl-serve (client side); it must never depend on candle.

mod algorithms;
mod error;
mod run;
mod sink;

pub use algorithms::{Algorithm, BranchTargets, Channel, aggregate};
pub use error::{Error, Result};
pub use run::{Orchestrator, StepSummary, write_batch};
pub use sink::{TrainingSample, pack, samples};
