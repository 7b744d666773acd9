//! The fused ops as candle ops: each runs its kernel from `crate::cpu` on CPU tensors and has a
//! real backward pass (candle-nn's fused ops have none, so gradients through them stop silently).
//! Other devices and dtypes run `composed`, the same math in candle's differentiable ops (on CUDA:
//! candle's kernels and cuBLAS); a CUDA kernel of an op would slot in through its `cuda_fwd`.

pub(crate) mod access;
mod adamw;
mod adapters;
mod attention;
pub mod composed;
mod elementwise;
mod layer;
mod linear;
mod logprobs;
mod norm;
mod recompute;
mod rope;
mod softmax_rows;

pub use adamw::{adamw_step, sum_squares};
pub use adapters::LayerAdapters;
pub use attention::attention;
pub use elementwise::swiglu;
pub use layer::{LayerWeights, decoder_layer, decoder_layer_adapted, decoder_layer_recomputed};
pub use linear::linear;
pub use logprobs::{head_logprobs, token_logprobs};
pub use norm::{head_norm_rope, rms_norm, rope};
pub use rope::Rope;

/// Whether `t` runs on the fused CPU kernels (f32/f64 on CPU); anything else (CUDA, half
/// precision) runs the same math composed of candle's differentiable ops.
pub fn runs_fused(t: &candle_core::Tensor) -> bool {
    t.device().is_cpu() && matches!(t.dtype(), candle_core::DType::F32 | candle_core::DType::F64)
}
