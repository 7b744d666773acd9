//! CPU kernels on plain slices: what the candle ops of `crate::ops` run on CPU and what the
//! inference runtime calls directly.

pub mod adamw;
pub mod attention;
mod attention_blocks;
pub mod decode;
pub mod dropout;
mod flash;
mod flash_tiles;
pub mod layer;
mod layer_shape;
pub mod linear;
pub mod logprobs;
pub mod lora;
pub mod norm;
pub mod packed;
mod prefetch;
pub mod simd;
pub mod swiglu;

use rayon::prelude::*;

/// Parallel reductions cut their items into at least this many contiguous runs.
const MIN_REDUCTION_RUNS: usize = 8;

/// Items per run for a parallel reduction over `items` (rayon's `fold_chunks`): the runs are
/// fixed, not left to work stealing, so every partial sum covers the same items on every call
/// and, added in run order ([`sum_in_order`]), the result has the same bits on every run — the
/// same for every pool of up to [`MIN_REDUCTION_RUNS`] threads, and above that a function of the
/// thread count, never of the schedule. A seeded training run is then reproducible.
pub(crate) fn reduction_run(items: usize) -> usize {
    items.div_ceil(rayon::current_num_threads().max(MIN_REDUCTION_RUNS)).max(1)
}

/// The element-wise sum of equally long `parts`, added in their order (so the rounding is fixed),
/// parallel over elements; `None` for no parts.
pub(crate) fn sum_in_order<T: crate::float::Real>(parts: Vec<Vec<T>>) -> Option<Vec<T>> {
    let mut parts = parts.into_iter();
    let mut total = parts.next()?;
    let rest: Vec<Vec<T>> = parts.collect();
    if rest.is_empty() {
        return Some(total);
    }
    const PER_TASK: usize = 1 << 14;
    total.par_chunks_mut(PER_TASK).enumerate().for_each(|(c, out)| {
        let span = c * PER_TASK..c * PER_TASK + out.len();
        for part in &rest {
            out.iter_mut().zip(&part[span.clone()]).for_each(|(a, b)| *a += *b);
        }
    });
    Some(total)
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_in_order_add_each_element_left_to_right() {
        // 1e8 + 1 - 1e8 in f32 is 0 left to right, 1 in another order: the order is the contract.
        let n = 40_000;
        let parts = vec![vec![1e8f32; n], vec![1.0; n], vec![-1e8; n]];
        assert_eq!(sum_in_order(parts).unwrap(), vec![0.0; n]);
        let parts = vec![vec![1e8f32; n], vec![-1e8; n], vec![1.0; n]];
        assert_eq!(sum_in_order(parts).unwrap(), vec![1.0; n]);
        assert!(sum_in_order::<f32>(Vec::new()).is_none());
    }

    #[test]
    fn reduction_runs_do_not_depend_on_small_pools() {
        let runs = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| reduction_run(1000))
        };
        assert_eq!(runs(1), 125);
        assert_eq!(runs(3), 125);
        assert_eq!(runs(8), 125);
        assert_eq!(runs(16), 63);
    }
}
