//! Causal grouped-query attention over a packed row, forward and backward, on token-major
//! buffers (`q [T, Hq*d]`, `k`/`v [T, Hk*d]`, exactly what the projections produce: no transposes,
//! no repeated key/value heads). Work runs in query blocks of at most `BLOCK` rows; a block's
//! scores against the keys it can see (its segment's ancestors, then its own segment up to the
//! block's last row) are one `[block x keys]` scratch, never a `T x T` matrix or mask. The
//! forward keeps the log-sum-exp of every (token, head) so the backward recomputes probabilities
//! without a second softmax pass.

use rayon::prelude::*;

use crate::cpu::attention_blocks::KeyRun;
pub use crate::cpu::attention_blocks::{AttnShape, Causal, KvRun};
use crate::cpu::attention_blocks::{blocks, key_runs, split_chunks};
use crate::cpu::flash;
use crate::cpu::simd::{dot, max_of, sum_of, vectorized};
use crate::float::Real;
use crate::gemm::{MatMut, MatRef, matmul};
use crate::layout::RowLayout;

/// Queries, keys and values of a packed row, token-major with their own row strides: three
/// buffers as the projections produce them ([`Qkv::separate`]), or the columns of one `[T, (Hq +
/// 2 Hk) d]` buffer ([`Qkv::packed`], one projection for all three).
#[derive(Debug, Clone, Copy)]
pub struct Qkv<'a, T> {
    /// Queries from the row's first token: `q[t * ldq + h * d + i]`.
    pub q: &'a [T],
    /// Keys: `k[t * ldk + g * d + i]`.
    pub k: &'a [T],
    /// Values, with the keys' stride.
    pub v: &'a [T],
    /// Row stride of `q`.
    pub ldq: usize,
    /// Row stride of `k` and `v`.
    pub ldk: usize,
}

impl<'a, T> Qkv<'a, T> {
    /// Three buffers `q [T, Hq*d]`, `k`/`v [T, Hk*d]`.
    pub fn separate(q: &'a [T], k: &'a [T], v: &'a [T], shape: AttnShape) -> Self {
        Qkv { q, k, v, ldq: shape.ldq(), ldk: shape.ldk() }
    }

    /// One buffer `[T, (Hq + 2 Hk) d]` holding each token's queries, then keys, then values.
    pub fn packed(qkv: &'a [T], shape: AttnShape) -> Self {
        let (qd, kd) = (shape.ldq(), shape.ldk());
        let ld = qd + 2 * kd;
        Qkv { q: qkv, k: &qkv[qd.min(qkv.len())..], v: &qkv[(qd + kd).min(qkv.len())..], ldq: ld, ldk: ld }
    }

    /// Whether the buffers hold `t` tokens.
    pub(crate) fn holds(&self, shape: AttnShape, t: usize) -> bool {
        let rows = |len: usize, ld: usize, w: usize| t == 0 || len >= (t - 1) * ld + w;
        rows(self.q.len(), self.ldq, shape.ldq())
            && rows(self.k.len(), self.ldk, shape.ldk())
            && rows(self.v.len(), self.ldk, shape.ldk())
    }
}

/// Scores `scale * q k^T` of one head's query rows against `runs` into `s` (`rows x keys`,
/// row-major), with keys of the last run beyond `causal` set to -inf.
fn scores<T: Real>(s: &mut [T], q: MatRef<'_, T>, runs: &[KvRun<'_, T>], ld: usize, causal: Causal, scale: T) {
    let (rows, keys) = (q.nrows(), runs.iter().map(|r| r.len).sum::<usize>());
    let mut col = 0;
    for r in runs {
        let kt = MatRef::new(r.k, r.len, q.ncols(), ld, 1).t();
        matmul(MatMut::new(&mut s[col..], rows, r.len, keys, 1), q, kt, scale, false);
        col += r.len;
    }
    let last = runs.last().map_or(0, |r| r.len);
    for i in 0..rows {
        let row = &mut s[i * keys..(i + 1) * keys];
        let seen = (keys - last + causal.diag + i * causal.step + 1).min(keys);
        for x in &mut row[seen..] {
            *x = T::NEG_INFINITY;
        }
    }
}

/// One head's attention: `out = softmax(scale q k^T) v` over `runs` for query rows `q`
/// (`rows x d`); row i's log-sum-exp goes to `lse[i * lse_stride]`. `s` is scratch.
#[allow(clippy::too_many_arguments)]
pub fn attend<T: Real>(
    q: MatRef<'_, T>,
    runs: &[KvRun<'_, T>],
    ld: usize,
    causal: Causal,
    scale: T,
    s: &mut Vec<T>,
    mut out: MatMut<'_, T>,
    lse: &mut [T],
    lse_stride: usize,
) {
    let (rows, d) = (q.nrows(), q.ncols());
    let keys: usize = runs.iter().map(|r| r.len).sum();
    s.resize(rows * keys, T::ZERO);
    scores(s, q, runs, ld, causal, scale);
    vectorized(
        #[inline(always)]
        || {
            for i in 0..rows {
                lse[i * lse_stride] = softmax_row(&mut s[i * keys..(i + 1) * keys]);
            }
        },
    );
    let mut col = 0;
    for (n, r) in runs.iter().enumerate() {
        let p = MatRef::new(&s[col..], rows, r.len, keys, 1);
        matmul(out.reborrow(), p, MatRef::new(r.v, r.len, d, ld, 1), T::ONE, n > 0);
        col += r.len;
    }
}

/// The key runs of `b` as slices of this head group's columns of `k` and `v`.
fn kv_runs<'a, T>(runs: &[KeyRun], k: &'a [T], v: &'a [T], ld: usize, col: usize) -> Vec<KvRun<'a, T>> {
    runs.iter().map(|r| KvRun { k: &k[r.start * ld + col..], v: &v[r.start * ld + col..], len: r.len }).collect()
}

/// Which kernel runs a head block: the fused one ([`flash`]) where it applies (f32, head width a
/// multiple of the SIMD width), else GEMM calls around a materialised score block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    Fused,
    /// Only the tests force it (to hold the fused kernel to it).
    #[cfg(test)]
    Gemm,
}

/// Forward: returns `o [T, Hq*d]` and the log-sum-exp `[T, Hq]` of every (token, head).
pub fn forward<T: Real>(layout: &RowLayout, shape: AttnShape, qkv: Qkv<'_, T>, scale: T) -> (Vec<T>, Vec<T>) {
    forward_on(layout, shape, qkv, scale, Path::Fused)
}

fn forward_on<T: Real>(
    layout: &RowLayout,
    shape: AttnShape,
    qkv: Qkv<'_, T>,
    scale: T,
    path: Path,
) -> (Vec<T>, Vec<T>) {
    let (t, d, hq) = (layout.len(), shape.head_dim, shape.q_heads);
    let Qkv { q, k, v, ldq, ldk } = qkv;
    assert!(qkv.holds(shape, t), "attention buffers do not match the row");
    let ldo = shape.ldq();
    let mut o = crate::cpu::zeroed(t * ldo);
    let mut lse = vec![T::ZERO; t * hq];
    if path == Path::Fused && flash::applies(d) {
        let fused = (|| {
            let row = flash::Row {
                layout,
                shape,
                q: T::as_f32(q)?,
                k: T::as_f32(k)?,
                v: T::as_f32(v)?,
                ldq,
                ldk,
                scale: T::f64(scale) as f32,
            };
            Some(flash::forward_row(&row, T::as_f32_mut(&mut o)?, T::as_f32_mut(&mut lse)?))
        })();
        if fused == Some(true) {
            return (o, lse);
        }
    }
    let blocks = blocks(layout);
    let o_chunks = split_chunks(&mut o, blocks.iter().map(|b| b.rows * ldo));
    let l_chunks = split_chunks(&mut lse, blocks.iter().map(|b| b.rows * hq));
    blocks.into_par_iter().zip(o_chunks).zip(l_chunks).for_each_init(Vec::new, |s, ((b, o_blk), l_blk)| {
        let runs = key_runs(layout, &b);
        let causal = Causal { diag: b.offset, step: 1 };
        for h in 0..hq {
            let g = shape.group(h);
            let qb = MatRef::new(&q[b.row * ldq + h * d..], b.rows, d, ldq, 1);
            let out = MatMut::new(&mut o_blk[h * d..], b.rows, d, ldo, 1);
            attend(qb, &kv_runs(&runs, k, v, ldk, g * d), ldk, causal, scale, s, out, &mut l_blk[h..], hq);
        }
    });
    (o, lse)
}

/// Softmax of one row in place; returns its log-sum-exp.
#[inline(always)]
pub(crate) fn softmax_row<T: Real>(row: &mut [T]) -> T {
    let max = max_of(row);
    for x in row.iter_mut() {
        *x = (*x - max).exp();
    }
    let sum = sum_of(row);
    let inv = T::ONE / sum;
    for x in row.iter_mut() {
        *x *= inv;
    }
    max + sum.ln()
}

/// Gradients `(dq, dk, dv)` (separate buffers) given the forward's output `o`, its log-sum-exp
/// and `d_o`.
pub fn backward<T: Real>(
    layout: &RowLayout,
    shape: AttnShape,
    qkv: Qkv<'_, T>,
    o: &[T],
    lse: &[T],
    d_o: &[T],
    scale: T,
) -> (Vec<T>, Vec<T>, Vec<T>) {
    let mut dq = crate::cpu::zeroed(layout.len() * shape.ldq());
    let (dk, dv) = backward_into(layout, shape, qkv, o, lse, d_o, scale, &mut dq, shape.ldq(), Path::Fused);
    (dq, dk, dv)
}

/// The gradient of a packed `[T, (Hq + 2 Hk) d]` buffer (see [`Qkv::packed`]).
pub fn backward_packed<T: Real>(
    layout: &RowLayout,
    shape: AttnShape,
    qkv: &[T],
    o: &[T],
    lse: &[T],
    d_o: &[T],
    scale: T,
) -> Vec<T> {
    let (qd, kd) = (shape.ldq(), shape.ldk());
    let ld = qd + 2 * kd;
    let mut d = crate::cpu::zeroed(layout.len() * ld);
    let (dk, dv) = backward_into(layout, shape, Qkv::packed(qkv, shape), o, lse, d_o, scale, &mut d, ld, Path::Fused);
    for ((row, k), v) in d.chunks_mut(ld).zip(dk.chunks(kd)).zip(dv.chunks(kd)) {
        row[qd..qd + kd].copy_from_slice(k);
        row[qd + kd..].copy_from_slice(v);
    }
    d
}

/// Writes `dq` into `dq_out` (row stride `ldq_out`, query columns first) and returns `(dk, dv)`
/// as `[T, Hk*d]` buffers.
#[allow(clippy::too_many_arguments)]
fn backward_into<T: Real>(
    layout: &RowLayout,
    shape: AttnShape,
    qkv: Qkv<'_, T>,
    o: &[T],
    lse: &[T],
    d_o: &[T],
    scale: T,
    dq_out: &mut [T],
    ldq_out: usize,
    path: Path,
) -> (Vec<T>, Vec<T>) {
    let (t, d, hq) = (layout.len(), shape.head_dim, shape.q_heads);
    let Qkv { q, k, v, ldq, ldk } = qkv;
    let (ldo, ldkv) = (shape.ldq(), shape.ldk());
    assert!(
        qkv.holds(shape, t)
            && o.len() == t * ldo
            && d_o.len() == t * ldo
            && lse.len() == t * hq
            && dq_out.len() == t * ldq_out,
        "attention gradients do not match the row"
    );
    if path == Path::Fused && flash::applies(d) {
        let mut dk = crate::cpu::zeroed(t * ldkv);
        let mut dv = crate::cpu::zeroed(t * ldkv);
        let fused = (|| {
            let row = flash::Row {
                layout,
                shape,
                q: T::as_f32(q)?,
                k: T::as_f32(k)?,
                v: T::as_f32(v)?,
                ldq,
                ldk,
                scale: T::f64(scale) as f32,
            };
            let grads = flash::RowGrads {
                o: T::as_f32(o)?,
                lse: T::as_f32(lse)?,
                d_o: T::as_f32(d_o)?,
                dq: T::as_f32_mut(dq_out)?,
                ldq: ldq_out,
                dk: T::as_f32_mut(&mut dk)?,
                dv: T::as_f32_mut(&mut dv)?,
            };
            Some(flash::backward_row(&row, grads))
        })();
        if fused == Some(true) {
            return (dk, dv);
        }
    }
    let blocks = blocks(layout);
    let dq_chunks = split_chunks(dq_out, blocks.iter().map(|b| b.rows * ldq_out));
    let zeros = || (vec![T::ZERO; t * ldkv], vec![T::ZERO; t * ldkv]);
    // Fixed runs of query blocks, their dK / dV sums added in order (bit-stable, `reduction_run`).
    let run = crate::cpu::reduction_run(blocks.len());
    let (dks, dvs): (Vec<Vec<T>>, Vec<Vec<T>>) = blocks
        .into_par_iter()
        .zip(dq_chunks)
        .fold_chunks(
            run,
            || (zeros(), Vec::new(), Vec::new()),
            |((mut dk, mut dv), mut p, mut ds), (b, dq_blk)| {
                let runs = key_runs(layout, &b);
                let keys: usize = runs.iter().map(|r| r.len).sum();
                for h in 0..hq {
                    let g = shape.group(h);
                    let causal = Causal { diag: b.offset, step: 1 };
                    p.resize(b.rows * keys, T::ZERO);
                    ds.resize(b.rows * keys, T::ZERO);
                    let qb = MatRef::new(&q[b.row * ldq + h * d..], b.rows, d, ldq, 1);
                    let dob = MatRef::new(&d_o[b.row * ldo + h * d..], b.rows, d, ldo, 1);
                    scores(&mut p, qb, &kv_runs(&runs, k, v, ldk, g * d), ldk, causal, scale);
                    // dP = dO · V^T, then dS = P * (dP - rowsum(dO * O)).
                    let mut col = 0;
                    for r in &runs {
                        let vt = MatRef::new(&v[r.start * ldk + g * d..], r.len, d, ldk, 1).t();
                        matmul(MatMut::new(&mut ds[col..], b.rows, r.len, keys, 1), dob, vt, T::ONE, false);
                        col += r.len;
                    }
                    vectorized(
                        #[inline(always)]
                        || {
                            for i in 0..b.rows {
                                let tok = b.row + i;
                                let l = lse[tok * hq + h];
                                let (orow, drow) = (&o[tok * ldo + h * d..][..d], &d_o[tok * ldo + h * d..][..d]);
                                let di = dot(orow, drow);
                                let (prow, dsrow) =
                                    (&mut p[i * keys..(i + 1) * keys], &mut ds[i * keys..(i + 1) * keys]);
                                for (pv, dv) in prow.iter_mut().zip(dsrow.iter_mut()) {
                                    *pv = (*pv - l).exp();
                                    *dv = *pv * (*dv - di);
                                }
                            }
                        },
                    );
                    let mut col = 0;
                    for (n, r) in runs.iter().enumerate() {
                        let kr = MatRef::new(&k[r.start * ldk + g * d..], r.len, d, ldk, 1);
                        let dsr = MatRef::new(&ds[col..], b.rows, r.len, keys, 1);
                        let pr = MatRef::new(&p[col..], b.rows, r.len, keys, 1);
                        matmul(MatMut::new(&mut dq_blk[h * d..], b.rows, d, ldq_out, 1), dsr, kr, scale, n > 0);
                        let dk_run = MatMut::new(&mut dk[r.start * ldkv + g * d..], r.len, d, ldkv, 1);
                        matmul(dk_run, dsr.t(), qb, scale, true);
                        let dv_run = MatMut::new(&mut dv[r.start * ldkv + g * d..], r.len, d, ldkv, 1);
                        matmul(dv_run, pr.t(), dob, T::ONE, true);
                        col += r.len;
                    }
                }
                ((dk, dv), p, ds)
            },
        )
        .map(|(acc, _, _)| acc)
        .unzip();
    match (crate::cpu::sum_in_order(dks), crate::cpu::sum_in_order(dvs)) {
        (Some(dk), Some(dv)) => (dk, dv),
        _ => zeros(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noise(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * scale
            })
            .collect()
    }

    fn worst(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| (x - y).abs() / (1.0 + y.abs())).fold(0.0, f32::max)
    }

    /// The fused kernel against the GEMM path, forward and backward, on head widths it takes
    /// (the SIMD width's multiples) and layouts that cover partial query tiles, key chunks that
    /// straddle the diagonal, shared prompts and grouped heads.
    #[test]
    fn the_fused_kernel_equals_the_gemm_path() {
        let layouts = [
            RowLayout::packed(&[1, 37, 130, 64]),
            RowLayout::new(&[70, 90, 5, 200], &[None, Some(0), Some(0), Some(1)]).unwrap(),
        ];
        for (i, layout) in layouts.iter().enumerate() {
            for (hq, hk, d) in [(4, 2, 32), (2, 1, 64), (2, 2, 128), (3, 1, 16)] {
                let shape = AttnShape { q_heads: hq, kv_heads: hk, head_dim: d };
                let t = layout.len();
                let w = shape.ldq() + 2 * shape.ldk();
                let qkv = noise(t * w, 3 + i as u64 + d as u64, 1.5);
                let d_o = noise(t * shape.ldq(), 11 + d as u64, 1.0);
                let scale = 1.0 / (d as f32).sqrt();
                let run = |path| {
                    let (o, lse) = forward_on(layout, shape, Qkv::packed(&qkv, shape), scale, path);
                    let mut dq = vec![0f32; t * w];
                    let (dk, dv) =
                        backward_into(layout, shape, Qkv::packed(&qkv, shape), &o, &lse, &d_o, scale, &mut dq, w, path);
                    (o, lse, dq, dk, dv)
                };
                let (fused, gemm) = (run(Path::Fused), run(Path::Gemm));
                let what = format!("layout {i}, {hq}/{hk} heads of {d}");
                assert!(worst(&fused.0, &gemm.0) < 2e-5, "{what}: output {}", worst(&fused.0, &gemm.0));
                assert!(worst(&fused.1, &gemm.1) < 2e-5, "{what}: log-sum-exp {}", worst(&fused.1, &gemm.1));
                assert!(worst(&fused.2, &gemm.2) < 5e-5, "{what}: dq {}", worst(&fused.2, &gemm.2));
                assert!(worst(&fused.3, &gemm.3) < 5e-5, "{what}: dk {}", worst(&fused.3, &gemm.3));
                assert!(worst(&fused.4, &gemm.4) < 5e-5, "{what}: dv {}", worst(&fused.4, &gemm.4));
            }
        }
    }
}
