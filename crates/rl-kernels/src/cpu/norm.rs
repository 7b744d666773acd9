//! RMSNorm over the last dimension (`y = x / sqrt(mean(x^2) + eps) * w`), forward and backward,
//! and the q/k variant fused with rotary embeddings: each head of a token-major `[T, H*d]` buffer
//! is normalised with a shared `[d]` weight, then rotated at the token's position (HF's rotate-half
//! convention). Rows are independent, so both run in parallel chunks of rows.

use rayon::prelude::*;

use crate::cpu::simd::{dot, vectorized};
use crate::float::Real;

/// Rows per parallel chunk (small rows are too cheap to split finer).
const ROWS_PER_TASK: usize = 32;

/// `1 / sqrt(mean(x^2) + eps)`, the sum of squares in f64 over eight independent lanes (so it
/// vectorises; one fixed order, shared by training and inference).
#[inline(always)]
fn rstd<T: Real>(x: &[T], eps: f64) -> T {
    let mut acc = [0.0f64; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for j in 0..LANES {
            let v = c[j].f64();
            acc[j] += v * v;
        }
    }
    let ss = rest.iter().fold(acc.iter().sum::<f64>(), |s, &v| s + v.f64() * v.f64());
    T::of(1.0 / (ss / x.len() as f64 + eps).sqrt())
}

/// Independent accumulators of the row reductions.
const LANES: usize = 8;

/// `y[r] = x[r] * rstd(x[r]) * w` for every row of width `w.len()`.
pub fn rms_norm_forward<T: Real>(x: &[T], w: &[T], eps: f64) -> Vec<T> {
    let n = w.len();
    let mut y = crate::cpu::zeroed(x.len());
    y.par_chunks_mut(n * ROWS_PER_TASK).zip(x.par_chunks(n * ROWS_PER_TASK)).for_each(|(yc, xc)| {
        vectorized(
            #[inline(always)]
            || {
                for (yr, xr) in yc.chunks_mut(n).zip(xc.chunks(n)) {
                    let r = rstd(xr, eps);
                    for ((y, &x), &w) in yr.iter_mut().zip(xr).zip(w) {
                        *y = x * r * w;
                    }
                }
            },
        );
    });
    y
}

/// One row's backward: adds to `dw`, writes `dx` (`dx` is scratch on entry).
#[inline(always)]
fn rms_row_backward<T: Real>(xr: &[T], w: &[T], dy: &[T], eps: f64, dx: &mut [T], dw: &mut [T]) {
    let n = w.len();
    let r = rstd(xr, eps);
    // dx = r * (dy*w - xhat * mean(dy*w*xhat)), xhat = x*r; dx holds dy*w first.
    for i in 0..n {
        dx[i] = dy[i] * w[i];
        dw[i] += dy[i] * xr[i] * r;
    }
    let mean = dot(dx, xr) * r / T::of(n as f64);
    for i in 0..n {
        dx[i] = r * (dx[i] - xr[i] * r * mean);
    }
}

/// Gradients `(dx, dw)` of [`rms_norm_forward`].
pub fn rms_norm_backward<T: Real>(x: &[T], w: &[T], dy: &[T], eps: f64) -> (Vec<T>, Vec<T>) {
    let n = w.len();
    let mut dx = crate::cpu::zeroed(x.len());
    // Weight-gradient partial sums over fixed runs of row chunks, added in order (bit-stable).
    let run = crate::cpu::reduction_run(x.len().div_ceil(n * ROWS_PER_TASK));
    let parts: Vec<Vec<T>> = dx
        .par_chunks_mut(n * ROWS_PER_TASK)
        .zip(x.par_chunks(n * ROWS_PER_TASK))
        .zip(dy.par_chunks(n * ROWS_PER_TASK))
        .fold_chunks(
            run,
            || vec![T::ZERO; n],
            |mut dw, ((dxc, xc), dyc)| {
                vectorized(
                    #[inline(always)]
                    || {
                        for ((dxr, xr), dyr) in dxc.chunks_mut(n).zip(xc.chunks(n)).zip(dyc.chunks(n)) {
                            rms_row_backward(xr, w, dyr, eps, dxr, &mut dw);
                        }
                    },
                );
                dw
            },
        )
        .collect();
    let dw = crate::cpu::sum_in_order(parts).unwrap_or_else(|| vec![T::ZERO; n]);
    (dx, dw)
}

/// Rotary tables: `cos`/`sin` of `position * inv_freq`, `[positions, d/2]` row-major.
#[derive(Debug, Clone, Copy)]
pub struct RopeTables<'a, T> {
    /// cos table.
    pub cos: &'a [T],
    /// sin table.
    pub sin: &'a [T],
}

/// A run of heads at the start of a token's row for [`heads_norm_rope_forward`]: `heads` heads
/// RMS-normalised with `norm` (`[d]`; none: rotated only), then rotated. Spans follow each other;
/// the columns after the last span are copied unchanged.
#[derive(Debug, Clone, Copy)]
pub struct HeadSpan<'a, T> {
    /// Heads in the span.
    pub heads: usize,
    /// The per-head norm weight, if the heads are normalised.
    pub norm: Option<&'a [T]>,
}

/// q/k norm + rotary: each head of `x [T, H*d]` is RMS-normalised with `w [d]`, then rotated at
/// `positions[t]`.
pub fn head_norm_rope_forward<T: Real>(
    x: &[T],
    w: &[T],
    eps: f64,
    positions: &[u32],
    rope: RopeTables<'_, T>,
) -> Vec<T> {
    let width = x.len() / positions.len().max(1);
    let span = HeadSpan { heads: width / w.len().max(1), norm: Some(w) };
    heads_norm_rope_forward(x, width, w.len(), &[span], eps, positions, rope)
}

/// Gradients `(dx, dw)` of [`head_norm_rope_forward`].
pub fn head_norm_rope_backward<T: Real>(
    x: &[T],
    w: &[T],
    eps: f64,
    positions: &[u32],
    rope: RopeTables<'_, T>,
    dy: &[T],
) -> (Vec<T>, Vec<T>) {
    let width = x.len() / positions.len().max(1);
    let span = HeadSpan { heads: width / w.len().max(1), norm: Some(w) };
    let (dx, mut dws) = heads_norm_rope_backward(x, dy, width, w.len(), &[span], eps, positions, rope);
    (dx, dws.pop().unwrap_or_default())
}

/// Norm + rotary over the spans of every token row of `x [T, width]` (heads of width `d`); e.g. a
/// packed `[q | k | v]` row is two spans (queries with the q norm, keys with the k norm) and the
/// values, copied.
pub fn heads_norm_rope_forward<T: Real>(
    x: &[T],
    width: usize,
    d: usize,
    spans: &[HeadSpan<'_, T>],
    eps: f64,
    positions: &[u32],
    rope: RopeTables<'_, T>,
) -> Vec<T> {
    let half = d / 2;
    let mut y = crate::cpu::zeroed(x.len());
    let job = width * ROWS_PER_TASK;
    y.par_chunks_mut(job).zip(x.par_chunks(job)).zip(positions.par_chunks(ROWS_PER_TASK)).for_each(|((yc, xc), pc)| {
        vectorized(
            #[inline(always)]
            || {
                for ((yt, xt), &p) in yc.chunks_mut(width).zip(xc.chunks(width)).zip(pc) {
                    let (cos, sin) = (&rope.cos[p as usize * half..][..half], &rope.sin[p as usize * half..][..half]);
                    let mut col = 0;
                    for span in spans {
                        for _ in 0..span.heads {
                            let (yh, xh) = (&mut yt[col..col + d], &xt[col..col + d]);
                            let r = match span.norm {
                                Some(_) => rstd(xh, eps),
                                None => T::ONE,
                            };
                            for i in 0..half {
                                let (wa, wb) = match span.norm {
                                    Some(w) => (w[i] * r, w[i + half] * r),
                                    None => (T::ONE, T::ONE),
                                };
                                let (a, b) = (xh[i] * wa, xh[i + half] * wb);
                                yh[i] = a * cos[i] - b * sin[i];
                                yh[i + half] = b * cos[i] + a * sin[i];
                            }
                            col += d;
                        }
                    }
                    yt[col..].copy_from_slice(&xt[col..]);
                }
            },
        );
    });
    y
}

/// Gradients of [`heads_norm_rope_forward`]: `dx` (the copied columns pass `dy` through) and one
/// norm-weight gradient per span (empty for spans without a norm).
#[allow(clippy::too_many_arguments)]
pub fn heads_norm_rope_backward<T: Real>(
    x: &[T],
    dy: &[T],
    width: usize,
    d: usize,
    spans: &[HeadSpan<'_, T>],
    eps: f64,
    positions: &[u32],
    rope: RopeTables<'_, T>,
) -> (Vec<T>, Vec<Vec<T>>) {
    let half = d / 2;
    let mut dx = crate::cpu::zeroed(x.len());
    let job = width * ROWS_PER_TASK;
    let no_grads = || spans.iter().map(|s| vec![T::ZERO; if s.norm.is_some() { d } else { 0 }]).collect::<Vec<_>>();
    // As in `rms_norm_backward`: fixed runs, partial sums added in order.
    let run = crate::cpu::reduction_run(positions.len().div_ceil(ROWS_PER_TASK));
    let parts: Vec<Vec<Vec<T>>> = dx
        .par_chunks_mut(job)
        .zip(x.par_chunks(job))
        .zip(dy.par_chunks(job))
        .zip(positions.par_chunks(ROWS_PER_TASK))
        .fold_chunks(
            run,
            || (no_grads(), vec![T::ZERO; d]),
            |(mut dws, mut dn), (((dxc, xc), dyc), pc)| {
                vectorized(
                    #[inline(always)]
                    || {
                        let tokens = dxc.chunks_mut(width).zip(xc.chunks(width)).zip(dyc.chunks(width)).zip(pc);
                        for (((dxt, xt), dyt), &p) in tokens {
                            let cos = &rope.cos[p as usize * half..][..half];
                            let sin = &rope.sin[p as usize * half..][..half];
                            let mut col = 0;
                            for (span, dw) in spans.iter().zip(dws.iter_mut()) {
                                for _ in 0..span.heads {
                                    let (dxh, xh, dyh) =
                                        (&mut dxt[col..col + d], &xt[col..col + d], &dyt[col..col + d]);
                                    // The rotation is orthogonal: its backward rotates the gradient back.
                                    let dst: &mut [T] = if span.norm.is_some() { &mut dn } else { &mut *dxh };
                                    for i in 0..half {
                                        let (ga, gb) = (dyh[i], dyh[i + half]);
                                        dst[i] = ga * cos[i] + gb * sin[i];
                                        dst[i + half] = gb * cos[i] - ga * sin[i];
                                    }
                                    if let Some(w) = span.norm {
                                        rms_row_backward(xh, w, &dn, eps, dxh, dw);
                                    }
                                    col += d;
                                }
                            }
                            dxt[col..].copy_from_slice(&dyt[col..]);
                        }
                    },
                );
                (dws, dn)
            },
        )
        .map(|(dws, _)| dws)
        .collect();
    let mut dws = no_grads();
    for (span, dw) in dws.iter_mut().enumerate() {
        if let Some(sum) = crate::cpu::sum_in_order(parts.iter().map(|p| p[span].clone()).collect()) {
            *dw = sum;
        }
    }
    (dx, dws)
}

/// Rotary embedding alone (Llama, Qwen2: no q/k norm): every head of `x [T, H*d]` rotated at
/// `positions[t]`. `inverse` rotates by the negative angle, which is the backward pass (the
/// rotation is orthogonal).
pub fn rope_rotate<T: Real>(x: &[T], d: usize, positions: &[u32], rope: RopeTables<'_, T>, inverse: bool) -> Vec<T> {
    let half = d / 2;
    let width = x.len() / positions.len().max(1);
    let mut y = crate::cpu::zeroed(x.len());
    let job = width * ROWS_PER_TASK;
    y.par_chunks_mut(job).zip(x.par_chunks(job)).zip(positions.par_chunks(ROWS_PER_TASK)).for_each(|((yc, xc), pc)| {
        vectorized(
            #[inline(always)]
            || {
                for ((yt, xt), &p) in yc.chunks_mut(width).zip(xc.chunks(width)).zip(pc) {
                    let (cos, sin) = (&rope.cos[p as usize * half..][..half], &rope.sin[p as usize * half..][..half]);
                    for (yh, xh) in yt.chunks_mut(d).zip(xt.chunks(d)) {
                        for i in 0..half {
                            let (a, b) = (xh[i], xh[i + half]);
                            let s = if inverse { -sin[i] } else { sin[i] };
                            yh[i] = a * cos[i] - b * s;
                            yh[i + half] = b * cos[i] + a * s;
                        }
                    }
                }
            },
        );
    });
    y
}
