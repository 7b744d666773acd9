//! The orchestrator's core: the algorithm registry (per-branch channels, dimension checks,
//! same-loss aggregation) and the train sink (traces to training samples, packing into rows).
//! Built so far: these pure parts. Not built yet: dispatch with bounded staleness, the weight
//! watcher, checkpoints, evaluation and `rl orchestrator` (see the README's status table).
//!
//! Depends on rl-configs, rl-proto and rl-serve (client side); it must never depend on candle.

mod algorithms;
mod error;
mod sink;

pub use algorithms::{Algorithm, BranchTargets, Channel, aggregate};
pub use error::{Error, Result};
pub use sink::{TrainingSample, pack, samples};
