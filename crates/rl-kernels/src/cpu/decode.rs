//! One decode step of sequences that continue one shared prefix (the samples of one prompt): the
//! query heads of every sequence that share a key/value head meet the prefix's keys in one
//! product, and its values in another, so the prefix is read and packed once per step instead
//! of once per sequence; then each sequence's own keys. A row's arithmetic is what
//! [`super::attention::attend`] does for that sequence alone, with more rows per product (equal to
//! rounding: the GEMM kernel's summation order depends on the product's shape). And one
//! sequence's new token alone ([`attend_step`]): a few rows against a short cache, where setting
//! up a GEMM costs more than the products.

use pulp::{Simd, WithSimd};

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

/// Vectors of the value tile [`attend_step`] accumulates at a time (per query row), the widest
/// of these that divides the head width: 4 at the 0.6B shape's 128; 2 where a head is two
/// vectors (width 32 under AVX-512), which otherwise fell back to a GEMM call per group.
const STEP_VECS: [usize; 3] = [4, 2, 1];

/// Keys whose value rows the value products share before moving on: every head group's share of
/// a cache row is used while the rows are in L2 (32 rows of 4 KiB at the 0.6B shape).
const STEP_KEYS: usize = 32;

/// `out = softmax(scale q K^T) V` for one new token, every head: `groups` key/value heads, each
/// shared by `rep` consecutive query heads (`q` and `out` are `[groups * rep, d]`), against every
/// key of `runs` (all visible: the token's own key is the last), whose rows of stride `ld` hold
/// every group's columns (`k[j * ld + g * d + i]`). The cache is read row by row, all groups at
/// once (a group at a time reads 512-byte pieces 4 KiB apart at the 0.6B shape, which streams at
/// half the rate). Returns false, writing nothing, where the head width is not a multiple of
/// the CPU's SIMD width; the caller then takes [`super::attention::attend`] per group. `s` is
/// scratch.
#[allow(clippy::too_many_arguments)]
pub fn attend_step(
    q: &[f32],
    groups: usize,
    rep: usize,
    d: usize,
    runs: &[KvRun<'_, f32>],
    ld: usize,
    scale: f32,
    s: &mut Vec<f32>,
    out: &mut [f32],
) -> bool {
    let rows = groups * rep;
    assert!(q.len() >= rows * d && out.len() >= rows * d, "{rows} rows of {d}");
    assert!(groups == 0 || ld >= groups * d, "cache rows of {ld} hold {groups} groups of {d}");
    let keys: usize = runs.iter().map(|r| r.len).sum();
    s.clear();
    s.resize(rows * keys, 0.0);
    super::simd::arch().dispatch(Step { q, groups, rep, d, runs, ld, scale, s, out })
}

struct Step<'a, 'r> {
    q: &'a [f32],
    groups: usize,
    rep: usize,
    d: usize,
    runs: &'a [KvRun<'r, f32>],
    ld: usize,
    scale: f32,
    s: &'a mut [f32],
    out: &'a mut [f32],
}

impl WithSimd for Step<'_, '_> {
    type Output = bool;

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) -> bool {
        let Step { q, groups, rep, d, runs, ld, scale, s, out } = self;
        let Some(tile) = STEP_VECS.into_iter().find(|v| d > 0 && d.is_multiple_of(v * S::F32_LANES)) else {
            return false;
        };
        let rows = groups * rep;
        let keys = s.len() / rows.max(1);
        // Scores, a cache row at a time: each group's keys against its query rows, two
        // accumulators a row.
        let zero = simd.splat_f32s(0.0);
        let mut col = 0;
        for run in runs {
            for j in 0..run.len {
                for g in 0..groups {
                    let (k, _) = S::as_simd_f32s(&run.k[j * ld + g * d..][..d]);
                    for r in g * rep..(g + 1) * rep {
                        let (qr, _) = S::as_simd_f32s(&q[r * d..][..d]);
                        let (mut a, mut b) = (zero, zero);
                        for (pq, pk) in qr.chunks_exact(2).zip(k.chunks_exact(2)) {
                            a = simd.mul_add_f32s(pq[0], pk[0], a);
                            b = simd.mul_add_f32s(pq[1], pk[1], b);
                        }
                        if qr.len() % 2 == 1 {
                            a = simd.mul_add_f32s(qr[qr.len() - 1], k[k.len() - 1], a);
                        }
                        s[r * keys + col + j] = simd.reduce_sum_f32s(simd.add_f32s(a, b)) * scale;
                    }
                }
            }
            col += run.len;
        }
        for r in 0..rows {
            softmax_row(&mut s[r * keys..(r + 1) * keys]);
        }
        // Values: blocks of STEP_KEYS cache rows; in each, every group's query rows two at a
        // time, in tiles of `tile` vectors of the head width.
        let mut first = true;
        let mut col = 0;
        for run in runs {
            for j0 in (0..run.len).step_by(STEP_KEYS) {
                let block = Block { run, j0, len: STEP_KEYS.min(run.len - j0), col: col + j0, ld, keys, d, first };
                for g in 0..groups {
                    let mut r = g * rep;
                    while r < (g + 1) * rep {
                        let two = (g + 1) * rep - r >= 2;
                        match (tile, two) {
                            (4, true) => values::<S, 2, 4>(simd, s, &block, g, r, out),
                            (4, false) => values::<S, 1, 4>(simd, s, &block, g, r, out),
                            (2, true) => values::<S, 2, 2>(simd, s, &block, g, r, out),
                            (2, false) => values::<S, 1, 2>(simd, s, &block, g, r, out),
                            (_, true) => values::<S, 2, 1>(simd, s, &block, g, r, out),
                            (_, false) => values::<S, 1, 1>(simd, s, &block, g, r, out),
                        }
                        r += if two { 2 } else { 1 };
                    }
                }
                first = false;
            }
            col += run.len;
        }
        if first {
            // No keys at all: nothing to attend to.
            out[..rows * d].fill(0.0);
        }
        true
    }
}

/// A block of consecutive keys of one run.
struct Block<'a, 'r> {
    run: &'a KvRun<'r, f32>,
    /// Its first key in the run, and how many.
    j0: usize,
    len: usize,
    /// Its first key's column in the score rows (`keys` long).
    col: usize,
    ld: usize,
    keys: usize,
    d: usize,
    /// Whether this is the first block (the output is written, not added to).
    first: bool,
}

/// Query rows `r0..r0 + R` (of group `g`) of `out (+)= P V` over one block of keys, in tiles of
/// `V` vectors.
#[inline(always)]
fn values<S: Simd, const R: usize, const V: usize>(
    simd: S,
    s: &[f32],
    b: &Block<'_, '_>,
    g: usize,
    r0: usize,
    out: &mut [f32],
) {
    let (w, d) = (V * S::F32_LANES, b.d);
    for c0 in (0..d).step_by(w) {
        let mut acc = [[simd.splat_f32s(0.0); V]; R];
        if !b.first {
            for (r, a) in acc.iter_mut().enumerate() {
                let (o, _) = S::as_simd_f32s(&out[(r0 + r) * d + c0..][..w]);
                a.copy_from_slice(o);
            }
        }
        for j in 0..b.len {
            let (v, _) = S::as_simd_f32s(&b.run.v[(b.j0 + j) * b.ld + g * d + c0..][..w]);
            for (r, a) in acc.iter_mut().enumerate() {
                let p = simd.splat_f32s(s[(r0 + r) * b.keys + b.col + j]);
                for (x, &vv) in a.iter_mut().zip(v) {
                    *x = simd.mul_add_f32s(p, vv, *x);
                }
            }
        }
        for (r, a) in acc.iter().enumerate() {
            let (o, _) = S::as_mut_simd_f32s(&mut out[(r0 + r) * d + c0..][..w]);
            o.copy_from_slice(a);
        }
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

    /// A new token's heads against a prefix and its own keys: what `attend` gives group by
    /// group, to rounding, for every head count and width (those the kernel does not take are
    /// refused), runs longer than a block of keys included.
    #[test]
    fn a_step_attends_as_attend_does() {
        for (d, groups, rep, lens) in [
            (128, 8, 2, vec![64, 33]),
            (64, 2, 1, vec![1]),
            (32, 1, 3, vec![7, 1]),
            (256, 3, 4, vec![130]),
            (24, 2, 2, vec![5]),
            (64, 4, 5, vec![40, 2, 31]),
            // Two and three vectors a head under AVX-512 (tiles of 2 and 1).
            (32, 4, 2, vec![70, 3]),
            (48, 2, 3, vec![33]),
            (16, 3, 2, vec![5, 40]),
        ] {
            let ld = groups * d + 8;
            let kv: Vec<(Vec<f32>, Vec<f32>)> = lens
                .iter()
                .enumerate()
                .map(|(i, &n)| (values(n * ld, 50 + i as u64), values(n * ld, 70 + i as u64)))
                .collect();
            let rows = groups * rep;
            let q = values(rows * d, 9);
            let scale = 1.0 / (d as f32).sqrt();
            let runs: Vec<KvRun<'_, f32>> = kv.iter().zip(&lens).map(|((k, v), &n)| KvRun { k, v, len: n }).collect();
            let mut got = vec![f32::NAN; rows * d];
            let took = attend_step(&q, groups, rep, d, &runs, ld, scale, &mut Vec::new(), &mut got);
            if !took {
                // Every SIMD width here (16, 8, 4 or 1 lanes) divides 16.
                assert!(!d.is_multiple_of(16), "d={d}: a width of whole vectors was refused");
                assert!(got.iter().all(|x| x.is_nan()), "a refused step wrote");
                continue;
            }
            for g in 0..groups {
                let group: Vec<KvRun<'_, f32>> =
                    runs.iter().map(|r| KvRun { k: &r.k[g * d..], v: &r.v[g * d..], len: r.len }).collect();
                let mut want = vec![0f32; rep * d];
                let last = lens.last().copied().unwrap_or(0);
                attend(
                    MatRef::new(&q[g * rep * d..], rep, d, d, 1),
                    &group,
                    ld,
                    Causal { diag: last - 1, step: 0 },
                    scale,
                    &mut Vec::new(),
                    MatMut::new(&mut want, rep, d, d, 1),
                    &mut vec![0.0; rep],
                    1,
                );
                let got = &got[g * rep * d..(g + 1) * rep * d];
                let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                assert!(worst < 1e-6, "d={d} groups={groups} rep={rep} group {g}: {worst}");
            }
        }
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
