//! Per-token log-probabilities under temperature: for target n, predicted by row `rows[n]` of the
//! logits `z [R, V]` at temperature `temps[n]`, `lp_n = log_softmax(z_r / t)[target_n]` and the
//! entropy of `softmax(z_r / t)`, in one pass over the row and without a `[R, V]` log-softmax.
//! The backward adds `g_n / t * (onehot(target) - p)` to row r; several targets may share a row
//! (a shared prompt's last token predicts every completion's first token).

use rayon::prelude::*;

use crate::cpu::simd::{max_of, sum_of, vectorized};
use crate::float::Real;

/// What each target reads: its row, token and temperature.
#[derive(Debug, Clone, PartialEq)]
pub struct Targets {
    /// Row of the logits that predicts target n.
    pub rows: Vec<u32>,
    /// Token id of target n.
    pub ids: Vec<u32>,
    /// Temperature of target n (> 0).
    pub temps: Vec<f32>,
}

impl Targets {
    /// Number of targets.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// No targets.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

/// (log-sum-exp, sum of p * z/t) of one row at temperature t.
#[inline(always)]
fn row_stats<T: Real>(z: &[T], t: T) -> (T, T) {
    const LANES: usize = 8;
    let inv = T::ONE / t;
    // max(z / t) = max(z) / t for t > 0.
    let max = max_of(z) * inv;
    let (mut sum, mut wsum) = ([T::ZERO; LANES], [T::ZERO; LANES]);
    let chunks = z.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for k in 0..LANES {
            let s = c[k] * inv;
            let e = (s - max).exp();
            sum[k] += e;
            wsum[k] += e * s;
        }
    }
    let (mut sum, mut wsum) = (sum_of(&sum), sum_of(&wsum));
    for &x in rest {
        let s = x * inv;
        let e = (s - max).exp();
        sum += e;
        wsum += e * s;
    }
    (max + sum.ln(), wsum / sum)
}

/// `[N, 2]` row-major: log-probability and entropy of every target.
pub fn logprobs_forward<T: Real>(z: &[T], vocab: usize, targets: &Targets) -> Vec<T> {
    let mut out = vec![T::ZERO; targets.len() * 2];
    out.par_chunks_mut(2).enumerate().for_each(|(n, o)| {
        let r = targets.rows[n] as usize;
        let row = &z[r * vocab..(r + 1) * vocab];
        let t = T::of(f64::from(targets.temps[n]));
        let (lse, mean_s) = vectorized(
            #[inline(always)]
            || row_stats(row, t),
        );
        o[0] = row[targets.ids[n] as usize] / t - lse;
        o[1] = lse - mean_s;
    });
    out
}

/// The gradient `[R, V]` of the logits given the gradient of the log-probabilities (the entropy
/// column carries none: it is a statistic).
pub fn logprobs_backward<T: Real>(z: &[T], vocab: usize, targets: &Targets, d_lp: &[T]) -> Vec<T> {
    let rows = z.len() / vocab;
    // Targets of each row, so rows are written by one task each.
    let mut by_row: Vec<Vec<usize>> = vec![Vec::new(); rows];
    for (n, &r) in targets.rows.iter().enumerate() {
        by_row[r as usize].push(n);
    }
    let mut dz = vec![T::ZERO; z.len()];
    dz.par_chunks_mut(vocab).zip(z.par_chunks(vocab)).zip(by_row.par_iter()).for_each(|((dzr, zr), ns)| {
        for &n in ns {
            let g = d_lp[n];
            if g == T::ZERO {
                continue;
            }
            let t = T::of(f64::from(targets.temps[n]));
            let scale = g / t;
            vectorized(
                #[inline(always)]
                || {
                    let (lse, _) = row_stats(zr, t);
                    for (d, &x) in dzr.iter_mut().zip(zr) {
                        *d -= scale * (x / t - lse).exp();
                    }
                },
            );
            dzr[targets.ids[n] as usize] += scale;
        }
    });
    dz
}
