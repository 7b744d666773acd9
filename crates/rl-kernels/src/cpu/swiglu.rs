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
    let mut y = crate::cpu::zeroed(g.len());
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
    let mut dg = crate::cpu::zeroed(g.len());
    let mut du = crate::cpu::zeroed(g.len());
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

/// Rows per parallel task of the packed variants (at least `PER_TASK` values).
fn rows_per_task(inter: usize) -> usize {
    PER_TASK.div_ceil(inter.max(1)).max(1)
}

/// `silu(g) * u` of every row of a packed `gu [T, 2 * inter]` (the gate's columns, then the up
/// projection's, as one projection by the stacked weights produces them); returns `[T, inter]`.
pub fn swiglu_packed_forward<T: Real>(gu: &[T], inter: usize) -> Vec<T> {
    let rows = rows_per_task(inter);
    let mut y = crate::cpu::zeroed(gu.len() / 2);
    y.par_chunks_mut(rows * inter).zip(gu.par_chunks(rows * 2 * inter)).for_each(|(yc, gc)| {
        vectorized(
            #[inline(always)]
            || {
                for (y, gu) in yc.chunks_mut(inter).zip(gc.chunks(2 * inter)) {
                    let (g, u) = gu.split_at(inter);
                    for ((y, &g), &u) in y.iter_mut().zip(g).zip(u) {
                        *y = g * sigmoid(g) * u;
                    }
                }
            },
        );
    });
    y
}

/// The gradient of the packed `gu` given `dy [T, inter]`.
pub fn swiglu_packed_backward<T: Real>(gu: &[T], dy: &[T], inter: usize) -> Vec<T> {
    let rows = rows_per_task(inter);
    let mut d = crate::cpu::zeroed(gu.len());
    d.par_chunks_mut(rows * 2 * inter).zip(gu.par_chunks(rows * 2 * inter)).zip(dy.par_chunks(rows * inter)).for_each(
        |((dc, gc), yc)| {
            vectorized(
                #[inline(always)]
                || {
                    for ((d, gu), dy) in dc.chunks_mut(2 * inter).zip(gc.chunks(2 * inter)).zip(yc.chunks(inter)) {
                        let (g, u) = gu.split_at(inter);
                        let (dg, du) = d.split_at_mut(inter);
                        for i in 0..inter {
                            let s = sigmoid(g[i]);
                            du[i] = dy[i] * g[i] * s;
                            dg[i] = dy[i] * u[i] * s * (T::ONE + g[i] * (T::ONE - s));
                        }
                    }
                },
            );
        },
    );
    d
}
