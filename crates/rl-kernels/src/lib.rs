//! Fused compute kernels for training and generation.
//!
//! - [`ops`]: differentiable candle ops (custom ops with real backward passes): causal
//!   grouped-query attention over packed and prefix-shared rows, RMSNorm, q/k head norm fused with
//!   rotary embeddings, SwiGLU, temperature log-softmax + gather + entropy; and AdamW in place.
//! - [`cpu`]: the kernels behind them on plain slices, also called directly by the inference
//!   runtime.
//! - [`RowLayout`]: which tokens of a packed row see which (the attention pattern and positions).
//!
//! - [`tune_process`]: process-wide settings for compute-heavy binaries (call first in `main`);
//!   [`LargeBlockCache`]: their global allocator (large freed blocks kept for reuse).
//!
//! `gemm.rs` (a checked call into the `gemm` crate), `process.rs` (setting the environment
//! while single-threaded, `mallopt`) and `alloc.rs` (the global allocator) hold the workspace's
//! only `unsafe` code.

mod alloc;
pub mod cpu;
mod float;
pub mod gemm;
mod layout;
pub mod ops;
mod pool;
mod process;

pub use alloc::{LARGE_BLOCK, LargeBlockCache, release_kept_blocks};
pub use cpu::adamw::AdamW;
pub use cpu::attention::AttnShape;
pub use cpu::dropout::Dropout;
pub use cpu::layer::LayerShape;
pub use cpu::logprobs::Targets;
pub use cpu::lora::{LoraShape, Proj};
pub use float::Real;
pub use layout::{LayoutError, RowLayout, Segment};
pub use pool::on_awake_pool;
#[cfg(feature = "cuda")]
pub use process::{CUDA_EVENT_TRACKING_VAR, CUDA_POOL_RELEASE_VAR, keep_cuda_pool_memory, single_stream_cuda};
pub use process::{Tuning, tune_process};
