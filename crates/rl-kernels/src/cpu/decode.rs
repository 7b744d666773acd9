//! One decode step of sequences that continue one shared prefix (the samples of one prompt): the
//! query heads of every sequence that share a key/value head meet the prefix's keys in one
//! product, and its values in another, so the prefix is read and packed once per step instead
//! of once per sequence; then each sequence's own keys. A row's arithmetic is what
//! [`super::attention::attend`] does for that sequence alone, with more rows per product (equal to
//! rounding: the GEMM kernel's summation order depends on the product's shape).

use crate::cpu::attention::{KvRun, softmax_row};
use crate::cpu::simd::vectorized;
use crate::float::Real;
use crate::gemm::{MatMut, MatRef, matmul};

/// `out = softmax(scale q [K_prefix; K_own_i]^T) [V_prefix; V_own_i]` for sequences
/// `i = 0..own.len()`, each with `rep` consecutive query rows of `q` (`[own.len() * rep, d]`)
/// and `out` (same shape, row-major). Every key is visible (one new token per sequence, its own
/// key the last of `own[i]`). `s` is scratch.
#[allow(clippy::too_many_arguments)]
pub fn attend_shared<T: Real>(
    q: MatRef<'_, T>,
    rep: usize,
    prefix: KvRun<'_, T>,
    own: &[KvRun<'_, T>],
    ld: usize,
    scale: T,
    s: &mut Vec<T>,
    out: &mut [T],
) {
    let (rows, d) = (q.nrows(), q.ncols());
    assert!(rep > 0 && rows == own.len() * rep && out.len() == rows * d, "rep query rows per sequence");
    let lp = prefix.len;
    // Each row's scores: the prefix's, then its sequence's own (rows of one width, the longest).
    let w = lp + own.iter().map(|r| r.len).max().unwrap_or(0);
    s.clear();
    s.resize(rows * w, T::ZERO);
    matmul(MatMut::new(s, rows, lp, w, 1), q, MatRef::new(prefix.k, lp, d, ld, 1).t(), scale, false);
    for (i, r) in own.iter().enumerate() {
        let kt = MatRef::new(r.k, r.len, d, ld, 1).t();
        matmul(MatMut::new(&mut s[i * rep * w + lp..], rep, r.len, w, 1), q.row_range(i * rep, rep), kt, scale, false);
    }
    vectorized(
        #[inline(always)]
        || {
            for (row, chunk) in s.chunks_exact_mut(w).enumerate() {
                softmax_row(&mut chunk[..lp + own[row / rep].len]);
            }
        },
    );
    let pv = MatRef::new(prefix.v, lp, d, ld, 1);
    matmul(MatMut::new(out, rows, d, d, 1), MatRef::new(s, rows, lp, w, 1), pv, T::ONE, false);
    for (i, r) in own.iter().enumerate() {
        let p = MatRef::new(&s[i * rep * w + lp..], rep, r.len, w, 1);
        let o = MatMut::new(&mut out[i * rep * d..], rep, d, d, 1);
        matmul(o, p, MatRef::new(r.v, r.len, d, ld, 1), T::ONE, true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::attention::{Causal, attend};

    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    /// Sequences of different own lengths over one prefix, attended together: each sequence's
    /// rows are `attend` over its [prefix, own] runs alone, to f32 rounding.
    #[test]
    fn each_sequence_gets_what_it_gets_alone() {
        for (d, rep, groups, lp) in [(32, 2, 2, 37), (64, 1, 1, 130), (16, 4, 2, 5), (20, 3, 1, 64)] {
            let ld = groups * d;
            let own_lens = [1usize, 9, 3, 1, 17, 2, 2, 40];
            let (kp, vp) = (values(lp * ld, 1), values(lp * ld, 2));
            let owns: Vec<(Vec<f32>, Vec<f32>)> = own_lens
                .iter()
                .enumerate()
                .map(|(i, &n)| (values(n * ld, 10 + i as u64), values(n * ld, 30 + i as u64)))
                .collect();
            let q = values(own_lens.len() * rep * d, 3);
            let scale = 1.0 / (d as f32).sqrt();
            for g in 0..groups {
                let prefix = KvRun { k: &kp[g * d..], v: &vp[g * d..], len: lp };
                let own: Vec<KvRun<'_, f32>> = owns
                    .iter()
                    .zip(own_lens)
                    .map(|((k, v), n)| KvRun { k: &k[g * d..], v: &v[g * d..], len: n })
                    .collect();
                let mut got = vec![0f32; q.len()];
                attend_shared(
                    MatRef::new(&q, own.len() * rep, d, d, 1),
                    rep,
                    prefix,
                    &own,
                    ld,
                    scale,
                    &mut Vec::new(),
                    &mut got,
                );
                for (i, r) in own.iter().enumerate() {
                    let mut want = vec![0f32; rep * d];
                    attend(
                        MatRef::new(&q[i * rep * d..], rep, d, d, 1),
                        &[prefix, *r],
                        ld,
                        Causal { diag: r.len - 1, step: 0 },
                        scale,
                        &mut Vec::new(),
                        MatMut::new(&mut want, rep, d, d, 1),
                        &mut vec![0.0; rep],
                        1,
                    );
                    let got = &got[i * rep * d..(i + 1) * rep * d];
                    let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                    assert!(worst < 1e-6, "d={d} rep={rep} sequence {i}: {worst}");
                }
            }
        }
    }
}
