//! Causal grouped-query attention over a packed row, forward and backward, on token-major
//! buffers (`q [T, Hq*d]`, `k`/`v [T, Hk*d]`, exactly what the projections produce: no transposes,
//! no repeated key/value heads). Work runs in query blocks of at most `BLOCK` rows; a block's
//! scores against the keys it can see (its segment's ancestors, then its own segment up to the
//! block's last row) are one `[block x keys]` scratch, never a `T x T` matrix or mask. The
//! forward keeps the log-sum-exp of every (token, head) so the backward recomputes probabilities
//! without a second softmax pass.

use rayon::prelude::*;

use crate::float::Real;
use crate::gemm::{MatMut, MatRef, matmul};
use crate::layout::RowLayout;

/// Query rows per block.
const BLOCK: usize = 64;

/// Head counts and width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnShape {
    /// Query heads.
    pub q_heads: usize,
    /// Key/value heads (divides `q_heads`).
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
}

impl AttnShape {
    fn ldq(&self) -> usize {
        self.q_heads * self.head_dim
    }

    fn ldk(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    fn group(&self, h: usize) -> usize {
        h / (self.q_heads / self.kv_heads)
    }
}

/// A run of visible keys: rows `start..start + len` of the key/value buffers.
#[derive(Debug, Clone, Copy)]
struct KeyRun {
    start: usize,
    len: usize,
}

/// One block of query rows: rows `row..row + rows` of the row, in segment `seg`, whose first row
/// is `offset` tokens into that segment.
#[derive(Debug, Clone, Copy)]
struct Block {
    seg: usize,
    row: usize,
    rows: usize,
    offset: usize,
}

fn blocks(layout: &RowLayout) -> Vec<Block> {
    let mut out = Vec::new();
    for (s, seg) in layout.segments().iter().enumerate() {
        let mut off = 0;
        while off < seg.len {
            let rows = BLOCK.min(seg.len - off);
            out.push(Block { seg: s, row: seg.start + off, rows, offset: off });
            off += rows;
        }
    }
    out
}

/// The keys block `b` sees: its ancestors in full, then its own segment up to its last row
/// (the last run is the causal one).
fn key_runs(layout: &RowLayout, b: &Block) -> Vec<KeyRun> {
    let mut runs: Vec<KeyRun> =
        layout.ancestor_ranges(b.seg).into_iter().map(|r| KeyRun { start: r.start, len: r.len() }).collect();
    let own = layout.segments()[b.seg].start;
    runs.push(KeyRun { start: own, len: b.offset + b.rows });
    runs
}

/// Scores `scale * q k^T` of one head's block against `runs` into `s` (`rows x keys`, row-major),
/// with the causal part of the last run set to -inf.
#[allow(clippy::too_many_arguments)]
fn scores<T: Real>(
    s: &mut [T],
    q: MatRef<'_, T>,
    k: &[T],
    ldk: usize,
    kcol: usize,
    runs: &[KeyRun],
    diag: usize,
    scale: T,
) {
    let (rows, keys) = (q.nrows(), runs.iter().map(|r| r.len).sum::<usize>());
    let mut col = 0;
    for r in runs {
        let kt = MatRef::new(&k[r.start * ldk + kcol..], r.len, q.ncols(), ldk, 1).t();
        matmul(MatMut::new(&mut s[col..], rows, r.len, keys, 1), q, kt, scale, false);
        col += r.len;
    }
    // Row i of the block sees own-segment keys up to diag + i.
    let last = runs.last().map_or(0, |r| r.len);
    for i in 0..rows {
        let row = &mut s[i * keys..(i + 1) * keys];
        for x in &mut row[keys - last + diag + i + 1..] {
            *x = T::NEG_INFINITY;
        }
    }
}

/// `out (+)= p · V` over the key runs (`p` is `rows x keys`).
#[allow(clippy::too_many_arguments)]
fn weighted_values<T: Real>(
    mut out: MatMut<'_, T>,
    p: &[T],
    rows: usize,
    v: &[T],
    ldk: usize,
    vcol: usize,
    d: usize,
    runs: &[KeyRun],
) {
    let keys: usize = runs.iter().map(|r| r.len).sum();
    let mut col = 0;
    for (n, r) in runs.iter().enumerate() {
        let pr = MatRef::new(&p[col..], rows, r.len, keys, 1);
        let vr = MatRef::new(&v[r.start * ldk + vcol..], r.len, d, ldk, 1);
        matmul(out.reborrow(), pr, vr, T::ONE, n > 0);
        col += r.len;
    }
}

/// Splits `data` into consecutive chunks of `sizes[i]` elements.
pub(crate) fn split_chunks<T>(mut data: &mut [T], sizes: impl IntoIterator<Item = usize>) -> Vec<&mut [T]> {
    let mut out = Vec::new();
    for n in sizes {
        let (head, tail) = data.split_at_mut(n);
        out.push(head);
        data = tail;
    }
    out
}

/// Forward: returns `o [T, Hq*d]` and the log-sum-exp `[T, Hq]` of every (token, head).
pub fn forward<T: Real>(layout: &RowLayout, shape: AttnShape, q: &[T], k: &[T], v: &[T], scale: T) -> (Vec<T>, Vec<T>) {
    let (t, d, hq) = (layout.len(), shape.head_dim, shape.q_heads);
    let (ldq, ldk) = (shape.ldq(), shape.ldk());
    assert!(q.len() == t * ldq && k.len() == t * ldk && v.len() == t * ldk, "attention buffers do not match the row");
    let mut o = vec![T::ZERO; t * ldq];
    let mut lse = vec![T::ZERO; t * hq];
    let blocks = blocks(layout);
    let o_chunks = split_chunks(&mut o, blocks.iter().map(|b| b.rows * ldq));
    let l_chunks = split_chunks(&mut lse, blocks.iter().map(|b| b.rows * hq));
    blocks.into_par_iter().zip(o_chunks).zip(l_chunks).for_each_init(Vec::new, |s, ((b, o_blk), l_blk)| {
        let runs = key_runs(layout, &b);
        let keys: usize = runs.iter().map(|r| r.len).sum();
        s.resize(b.rows * keys, T::ZERO);
        for h in 0..hq {
            let g = shape.group(h);
            let qb = MatRef::new(&q[b.row * ldq + h * d..], b.rows, d, ldq, 1);
            scores(s, qb, k, ldk, g * d, &runs, b.offset, scale);
            for i in 0..b.rows {
                l_blk[i * hq + h] = softmax_row(&mut s[i * keys..(i + 1) * keys]);
            }
            let out = MatMut::new(&mut o_blk[h * d..], b.rows, d, ldq, 1);
            weighted_values(out, s, b.rows, v, ldk, g * d, d, &runs);
        }
    });
    (o, lse)
}

/// Softmax of one row in place; returns its log-sum-exp.
fn softmax_row<T: Real>(row: &mut [T]) -> T {
    let max = row.iter().fold(T::NEG_INFINITY, |m, &x| m.max(x));
    let mut sum = T::ZERO;
    for x in row.iter_mut() {
        *x = (*x - max).exp();
        sum += *x;
    }
    let inv = T::ONE / sum;
    for x in row.iter_mut() {
        *x *= inv;
    }
    max + sum.ln()
}

/// Gradients `(dq, dk, dv)` given the forward's output `o`, its log-sum-exp and `d_o`.
#[allow(clippy::too_many_arguments)]
pub fn backward<T: Real>(
    layout: &RowLayout,
    shape: AttnShape,
    q: &[T],
    k: &[T],
    v: &[T],
    o: &[T],
    lse: &[T],
    d_o: &[T],
    scale: T,
) -> (Vec<T>, Vec<T>, Vec<T>) {
    let (t, d, hq) = (layout.len(), shape.head_dim, shape.q_heads);
    let (ldq, ldk) = (shape.ldq(), shape.ldk());
    assert!(
        o.len() == t * ldq && d_o.len() == t * ldq && lse.len() == t * hq,
        "attention gradients do not match the row"
    );
    let mut dq = vec![T::ZERO; t * ldq];
    let blocks = blocks(layout);
    let dq_chunks = split_chunks(&mut dq, blocks.iter().map(|b| b.rows * ldq));
    let zeros = || (vec![T::ZERO; t * ldk], vec![T::ZERO; t * ldk]);
    let (dk, dv) = blocks
        .into_par_iter()
        .zip(dq_chunks)
        .fold(
            || (zeros(), Vec::new(), Vec::new()),
            |((mut dk, mut dv), mut p, mut ds), (b, dq_blk)| {
                let runs = key_runs(layout, &b);
                let keys: usize = runs.iter().map(|r| r.len).sum();
                p.resize(b.rows * keys, T::ZERO);
                ds.resize(b.rows * keys, T::ZERO);
                for h in 0..hq {
                    let g = shape.group(h);
                    let qb = MatRef::new(&q[b.row * ldq + h * d..], b.rows, d, ldq, 1);
                    let dob = MatRef::new(&d_o[b.row * ldq + h * d..], b.rows, d, ldq, 1);
                    scores(&mut p, qb, k, ldk, g * d, &runs, b.offset, scale);
                    // dP = dO · V^T, then dS = P * (dP - rowsum(dO * O)).
                    let mut col = 0;
                    for r in &runs {
                        let vt = MatRef::new(&v[r.start * ldk + g * d..], r.len, d, ldk, 1).t();
                        matmul(MatMut::new(&mut ds[col..], b.rows, r.len, keys, 1), dob, vt, T::ONE, false);
                        col += r.len;
                    }
                    for i in 0..b.rows {
                        let tok = b.row + i;
                        let l = lse[tok * hq + h];
                        let (orow, drow) = (&o[tok * ldq + h * d..][..d], &d_o[tok * ldq + h * d..][..d]);
                        let di = orow.iter().zip(drow).fold(T::ZERO, |acc, (&a, &b)| acc + a * b);
                        let (prow, dsrow) = (&mut p[i * keys..(i + 1) * keys], &mut ds[i * keys..(i + 1) * keys]);
                        for (pv, dv) in prow.iter_mut().zip(dsrow.iter_mut()) {
                            *pv = (*pv - l).exp();
                            *dv = *pv * (*dv - di);
                        }
                    }
                    let mut col = 0;
                    for (n, r) in runs.iter().enumerate() {
                        let kr = MatRef::new(&k[r.start * ldk + g * d..], r.len, d, ldk, 1);
                        let dsr = MatRef::new(&ds[col..], b.rows, r.len, keys, 1);
                        let pr = MatRef::new(&p[col..], b.rows, r.len, keys, 1);
                        matmul(MatMut::new(&mut dq_blk[h * d..], b.rows, d, ldq, 1), dsr, kr, scale, n > 0);
                        let dk_run = MatMut::new(&mut dk[r.start * ldk + g * d..], r.len, d, ldk, 1);
                        matmul(dk_run, dsr.t(), qb, scale, true);
                        let dv_run = MatMut::new(&mut dv[r.start * ldk + g * d..], r.len, d, ldk, 1);
                        matmul(dv_run, pr.t(), dob, T::ONE, true);
                        col += r.len;
                    }
                }
                ((dk, dv), p, ds)
            },
        )
        .map(|(acc, _, _)| acc)
        .reduce_with(|(mut ak, mut av), (bk, bv): (Vec<T>, Vec<T>)| {
            ak.iter_mut().zip(&bk).for_each(|(a, b)| *a += *b);
            av.iter_mut().zip(&bv).for_each(|(a, b)| *a += *b);
            (ak, av)
        })
        .unwrap_or_else(zeros);
    (dq, dk, dv)
}
