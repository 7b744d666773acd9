//! CPU kernels on plain slices: what the candle ops of `crate::ops` run on CPU and what the
//! inference runtime calls directly.

pub mod adamw;
pub mod attention;
pub mod decode;
mod flash;
pub mod layer;
pub mod linear;
pub mod logprobs;
pub mod norm;
pub mod packed;
pub mod simd;
pub mod swiglu;

use rayon::prelude::*;

/// Buffers at least this long are zero-filled by every thread of the pool.
const PARALLEL_ZERO_MIN: usize = 1 << 16;

/// `n` zeros. Large buffers are filled in parallel: a serial fill of the layer's weight gradient
/// and activations ran while the other threads waited.
pub(crate) fn zeroed<T: crate::float::Real>(n: usize) -> Vec<T> {
    if n < PARALLEL_ZERO_MIN || rayon::current_num_threads() < 2 {
        return vec![T::ZERO; n];
    }
    let mut v = Vec::with_capacity(n);
    v.par_extend(rayon::iter::repeat_n(T::ZERO, n));
    v
}
