//! AdamW (decoupled weight decay, bias correction) as two fused passes over a parameter: the
//! moments `[m | v]` (one buffer of 2n) take the gradient, then the weight takes the update.

use rayon::prelude::*;

use crate::cpu::simd::vectorized;
use crate::float::Real;

const PER_TASK: usize = 16 * 1024;

/// AdamW hyper-parameters of one update.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamW {
    /// Learning rate.
    pub lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator epsilon.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// The update's 1-based step (for bias correction).
    pub step: u64,
    /// Factor applied to the gradient first (global-norm clipping).
    pub grad_scale: f64,
}

/// `m = b1 m + (1 - b1) g`, `v = b2 v + (1 - b2) g^2` with `g` scaled by `grad_scale`;
/// `state` is `[m | v]`.
pub fn moments_update<T: Real>(state: &mut [T], g: &[T], h: &AdamW) {
    let n = g.len();
    let (m, v) = state.split_at_mut(n);
    let (b1, b2, gs) = (T::of(h.beta1), T::of(h.beta2), T::of(h.grad_scale));
    let (c1, c2) = (T::ONE - b1, T::ONE - b2);
    m.par_chunks_mut(PER_TASK).zip(v.par_chunks_mut(PER_TASK)).zip(g.par_chunks(PER_TASK)).for_each(|((m, v), g)| {
        vectorized(
            #[inline(always)]
            || {
                for i in 0..g.len() {
                    let gi = g[i] * gs;
                    m[i] = m[i] * b1 + gi * c1;
                    v[i] = v[i] * b2 + gi * gi * c2;
                }
            },
        );
    });
}

/// `w = w (1 - lr wd) - lr m_hat / (sqrt(v_hat) + eps)`; `state` is `[m | v]`.
pub fn apply_update<T: Real>(w: &mut [T], state: &[T], h: &AdamW) {
    let n = w.len();
    let (m, v) = state.split_at(n);
    let t = i32::try_from(h.step).unwrap_or(i32::MAX);
    let (c1, c2) = (T::of(1.0 / (1.0 - h.beta1.powi(t))), T::of(1.0 / (1.0 - h.beta2.powi(t))));
    let (lr, eps, decay) = (T::of(h.lr), T::of(h.eps), T::of(1.0 - h.lr * h.weight_decay));
    w.par_chunks_mut(PER_TASK).zip(m.par_chunks(PER_TASK)).zip(v.par_chunks(PER_TASK)).for_each(|((w, m), v)| {
        vectorized(
            #[inline(always)]
            || {
                for i in 0..w.len() {
                    let update = (m[i] * c1) / ((v[i] * c2).sqrt() + eps);
                    w[i] = w[i] * decay - update * lr;
                }
            },
        );
    });
}

/// The sum of squares of `x`, accumulated in f64 over parallel chunks and independent lanes; the
/// chunks' sums are added in order, so the result does not depend on the thread count.
pub fn sum_squares<T: Real>(x: &[T]) -> f64 {
    let parts: Vec<f64> = x
        .par_chunks(PER_TASK)
        .map(|c| {
            vectorized(
                #[inline(always)]
                || {
                    let mut acc = [0.0f64; 8];
                    let chunks = c.chunks_exact(8);
                    let rest = chunks.remainder();
                    for ch in chunks {
                        for j in 0..8 {
                            acc[j] += ch[j].f64() * ch[j].f64();
                        }
                    }
                    rest.iter().fold(acc.iter().sum::<f64>(), |s, v| s + v.f64() * v.f64())
                },
            )
        })
        .collect();
    parts.iter().sum()
}
