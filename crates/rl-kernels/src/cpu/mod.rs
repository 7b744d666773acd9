//! CPU kernels on plain slices: what the candle ops of `crate::ops` run on CPU and what the
//! inference runtime calls directly.

pub mod adamw;
pub mod attention;
pub mod layer;
pub mod linear;
pub mod logprobs;
pub mod norm;
pub mod packed;
pub mod simd;
pub mod swiglu;
