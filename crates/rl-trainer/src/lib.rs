//! Training in candle: the RL loss with per-token temperature scaling and probability-difference
//! masking, AdamW with checkpointable state, the RL loop over batches written by the orchestrator,
//! weight broadcasts for the inference server, and checkpoints with exact resume.
//!
//! Depends on rl-model, rl-configs and rl-proto's plain messages; it must never depend on tonic or
//! axum (it talks to the rest of the system through files).

mod batch;
mod checkpoint;
mod error;
mod greedy_exact;
mod loss;
mod optim;
mod sft;
mod sft_groups;
mod sft_rows;
mod train;
mod weights;

pub use batch::{read_batch, wait_for_batch};
pub use checkpoint::{clean_broadcasts, find_checkpoint, write_broadcast, write_checkpoint};
pub use error::{Error, Result};
pub use loss::{LossStats, StepCounts, TokenLogprobs, micro_loss, row_layout, step_counts, token_logprobs};
pub use optim::{Optimizer, clip_factor, global_norm, lr_at};
pub use rl_model::Pass;
pub use rl_proto::train::v1::{MicroBatch, TrainBatch};
pub use sft::{GroupWeighing, SftEnd, SftReport, SftTrainer, tokenize};
pub use sft_groups::{SftGroup, shares_from_lags};
pub use sft_rows::{Fit, SftExample, fit, pack, shared_prompt};
pub use train::{RlTrainer, StepId, StepReport, StepTimes, device, step_gradients};
pub use weights::Trained;
