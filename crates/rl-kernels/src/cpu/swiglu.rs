//! SwiGLU's gate: `y = silu(g) * u`, forward and backward, elementwise over equal-shaped buffers.

use rayon::prelude::*;

use crate::cpu::simd::vectorized;
use crate::float::Real;

const PER_TASK: usize = 16 * 1024;

#[inline(always)]
fn sigmoid<T: Real>(x: T) -> T {
    T::ONE / (T::ONE + (-x).exp())
}

/// `silu(g) * u`.
pub fn swiglu_forward<T: Real>(g: &[T], u: &[T]) -> Vec<T> {
    let mut y = vec![T::ZERO; g.len()];
    y.par_chunks_mut(PER_TASK).zip(g.par_chunks(PER_TASK)).zip(u.par_chunks(PER_TASK)).for_each(|((y, g), u)| {
        vectorized(
            #[inline(always)]
            || {
                for ((y, &g), &u) in y.iter_mut().zip(g).zip(u) {
                    *y = g * sigmoid(g) * u;
                }
            },
        );
    });
    y
}

/// Gradients `(dg, du)`.
pub fn swiglu_backward<T: Real>(g: &[T], u: &[T], dy: &[T]) -> (Vec<T>, Vec<T>) {
    let mut dg = vec![T::ZERO; g.len()];
    let mut du = vec![T::ZERO; g.len()];
    dg.par_chunks_mut(PER_TASK)
        .zip(du.par_chunks_mut(PER_TASK))
        .zip(g.par_chunks(PER_TASK).zip(u.par_chunks(PER_TASK)).zip(dy.par_chunks(PER_TASK)))
        .for_each(|((dg, du), ((g, u), dy))| {
            vectorized(
                #[inline(always)]
                || {
                    for i in 0..g.len() {
                        let s = sigmoid(g[i]);
                        du[i] = dy[i] * g[i] * s;
                        dg[i] = dy[i] * u[i] * s * (T::ONE + g[i] * (T::ONE - s));
                    }
                },
            );
        });
    (dg, du)
}
