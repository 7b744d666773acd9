//! The fused ops as candle ops: each runs its kernel from `crate::cpu` on CPU tensors and has a
//! real backward pass (candle-nn's fused ops have none, so gradients through them stop silently).
//! CUDA implementations slot in through the same ops' `cuda_fwd`.

pub(crate) mod access;
mod adamw;
mod attention;
mod elementwise;
mod linear;
mod logprobs;
mod norm;

pub use adamw::{adamw_step, sum_squares};
pub use attention::attention;
pub use elementwise::swiglu;
pub use linear::linear;
pub use logprobs::token_logprobs;
pub use norm::{Rope, head_norm_rope, rms_norm};
