//! Fused ("flash") attention for f32 on one head of one query block: scores, softmax and the
//! value product in one pass over the keys, chunk by chunk, with nothing larger than a
//! `[64 keys x 2 SIMD vectors of queries]` tile ever written (it stays in L1). The GEMM path of
//! `attention.rs` writes a `[64 x keys]` score matrix per head and reads it three more times
//! (softmax, then the products' packing), which at head widths of 32 cost more than the products.
//!
//! Queries run along the SIMD lanes of the score tiles, so each query's running max, sum and
//! log-sum-exp are plain vector operations (no horizontal reductions), and the masks are a lane
//! compare. Products into head-width rows (the output, dQ, dK, dV) are register tiles of `R`
//! rows x the head width, broadcasting one factor per row. Widths that are not a multiple of the
//! SIMD width, and f64, take the GEMM path (`attention.rs` decides).

use pulp::{Simd, WithSimd};
use rayon::prelude::*;

use crate::cpu::attention_blocks::{AttnShape, Causal, KeyRun, KvRun, blocks, key_runs, split_chunks};
use crate::cpu::flash_tiles::{accumulate, causal_span, instantiated, load_tile, mask, online_softmax, scores, tiling};
use crate::cpu::simd::exp_f32;
use crate::layout::RowLayout;

/// Keys per softmax chunk (the online rescaling happens once per chunk).
const CHUNK: usize = 64;

/// One head of one query block: `rows` query rows from `q` (row stride `ldq`, the slice starting
/// at this head's first column) against `runs` (the last one causal, as `causal` says).
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeadBlock<'a> {
    pub q: &'a [f32],
    pub ldq: usize,
    pub rows: usize,
    pub runs: &'a [KvRun<'a, f32>],
    pub ldk: usize,
    pub head_dim: usize,
    pub causal: Causal,
    pub scale: f32,
}

/// Reusable per-thread buffers.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    /// Transposed (scaled) queries `[d][QT]`.
    qt: Vec<f32>,
    /// Transposed output gradient `[d][QT]` (backward).
    dot: Vec<f32>,
    /// Score / probability tile `[CHUNK][QT]`.
    st: Vec<f32>,
    /// dP / dS tile `[CHUNK][QT]` (backward).
    dst: Vec<f32>,
    /// Output (forward) or dQ (backward) accumulator `[QT][d]`.
    acc: Vec<f32>,
    /// Per query lane: running max, running sum, rescale factor, last visible key.
    m: Vec<f32>,
    l: Vec<f32>,
    alpha: Vec<f32>,
    limit: Vec<f32>,
    /// Per query lane (backward): log-sum-exp and rowsum(dO * O).
    lse: Vec<f32>,
    di: Vec<f32>,
    /// The tile's query and output-gradient rows, contiguous `[QT][d]` (backward: the
    /// right-hand sides of dK and dV, re-read for every key chunk).
    q_rows: Vec<f32>,
    do_rows: Vec<f32>,
}

/// Where the gradients of one (query block, head) go (backward).
pub(crate) struct Grads<'a> {
    /// The forward's output rows (stride `ldo`, this head's columns first).
    pub o: &'a [f32],
    /// The output gradient, same layout.
    pub d_o: &'a [f32],
    pub ldo: usize,
    /// Log-sum-exp of each query row: `lse[i * lse_stride]`.
    pub lse: &'a [f32],
    pub lse_stride: usize,
    /// dQ rows (stride `ldq`, this head's columns first), overwritten.
    pub dq: &'a mut [f32],
    pub ldq: usize,
    /// The head group's dK and dV (rows of stride `ldkv`, its columns first), accumulated
    /// into: run `r`'s key `j` is row `starts[r] + j`.
    pub dk: &'a mut [f32],
    pub dv: &'a mut [f32],
    pub ldkv: usize,
    pub starts: &'a [usize],
}

/// A packed row's queries, keys and values (token-major, their own row strides).
pub(crate) struct Row<'a> {
    pub layout: &'a RowLayout,
    pub shape: AttnShape,
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub ldq: usize,
    pub ldk: usize,
    pub scale: f32,
}

/// What the backward of a row reads and writes.
pub(crate) struct RowGrads<'a> {
    /// The forward's output `[T, Hq d]` and log-sum-exp `[T, Hq]`, and the output gradient.
    pub o: &'a [f32],
    pub lse: &'a [f32],
    pub d_o: &'a [f32],
    /// dQ rows, stride `ldq` (query columns first), overwritten.
    pub dq: &'a mut [f32],
    pub ldq: usize,
    /// dK and dV `[T, Hk d]`, added to (the caller passes zeros).
    pub dk: &'a mut [f32],
    pub dv: &'a mut [f32],
}

/// Whether the fused kernel takes heads of width `d` on this CPU.
pub(crate) fn applies(d: usize) -> bool {
    struct Op(usize);
    impl WithSimd for Op {
        type Output = bool;
        #[inline(always)]
        fn with_simd<S: Simd>(self, _: S) -> bool {
            instantiated(tiling::<S>(self.0))
        }
    }
    super::simd::arch().dispatch(Op(d))
}

/// Each head group's columns of `x` (`t` rows, stride `ld`) as one contiguous `[t][d]` block,
/// groups one after another. Keys and values are re-read by every query tile; rows of a packed
/// q/k/v buffer are 2 KiB or more apart, which maps a chunk's rows onto a few L1 sets.
fn by_group(x: &[f32], ld: usize, t: usize, groups: usize, d: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(groups * t * d);
    for g in 0..groups {
        for tok in 0..t {
            out.extend_from_slice(&x[tok * ld + g * d..][..d]);
        }
    }
    out
}

/// Forward over a whole row into `o [T, Hq d]` and `lse [T, Hq]`; false (nothing written) when
/// the head width does not suit the CPU (see [`applies`]).
pub(crate) fn forward_row(row: &Row<'_>, o: &mut [f32], lse: &mut [f32]) -> bool {
    let Row { layout, shape, q, k, v, ldq, ldk, scale } = *row;
    let (t, d, hq, hk) = (layout.len(), shape.head_dim, shape.q_heads, shape.kv_heads);
    if !applies(d) {
        return false;
    }
    let (kc, vc) = (by_group(k, ldk, t, hk, d), by_group(v, ldk, t, hk, d));
    let ldo = shape.ldq();
    let blocks = blocks(layout);
    let o_chunks = split_chunks(o, blocks.iter().map(|b| b.rows * ldo));
    let l_chunks = split_chunks(lse, blocks.iter().map(|b| b.rows * hq));
    blocks.into_par_iter().zip(o_chunks).zip(l_chunks).for_each_init(Scratch::default, |sc, ((b, o_blk), l_blk)| {
        let runs = key_runs(layout, &b);
        for h in 0..hq {
            let at = shape.group(h) * t * d;
            let kv: Vec<KvRun<'_, f32>> = runs
                .iter()
                .map(|r| KvRun { k: &kc[at + r.start * d..], v: &vc[at + r.start * d..], len: r.len })
                .collect();
            let head = HeadBlock {
                q: &q[b.row * ldq + h * d..],
                ldq,
                rows: b.rows,
                runs: &kv,
                ldk: d,
                head_dim: d,
                causal: Causal { diag: b.offset, step: 1 },
                scale,
            };
            forward(&head, &mut o_blk[h * d..], ldo, &mut l_blk[h..], hq, sc);
        }
    });
    true
}

/// Backward over a whole row (see [`RowGrads`]); false (nothing written) when the head width
/// does not suit the CPU.
pub(crate) fn backward_row(row: &Row<'_>, g: RowGrads<'_>) -> bool {
    let Row { layout, shape, q, k, v, ldq, ldk, scale } = *row;
    let (t, d, hq, hk) = (layout.len(), shape.head_dim, shape.q_heads, shape.kv_heads);
    if !applies(d) {
        return false;
    }
    let (kc, vc) = (by_group(k, ldk, t, hk, d), by_group(v, ldk, t, hk, d));
    let RowGrads { o, lse, d_o, dq, ldq: ldq_out, dk, dv } = g;
    let ldo = shape.ldq();
    let blocks = blocks(layout);
    let runs: Vec<Vec<KeyRun>> = blocks.iter().map(|b| key_runs(layout, b)).collect();
    // One (query block, head) of the row: its dQ rows go to `dq` (stride `ldq`), its dK / dV
    // rows are added to the group's `[keys][d]` blocks `dk_g` / `dv_g`, whose first row is key
    // `lo` of the row.
    let head_block =
        |i: usize, h: usize, dq: &mut [f32], lo: usize, dk_g: &mut [f32], dv_g: &mut [f32], sc: &mut Scratch| {
            let (b, runs) = (&blocks[i], &runs[i]);
            let starts: Vec<usize> = runs.iter().map(|r| r.start - lo).collect();
            let at = shape.group(h) * t * d;
            let kv: Vec<KvRun<'_, f32>> = runs
                .iter()
                .map(|r| KvRun { k: &kc[at + r.start * d..], v: &vc[at + r.start * d..], len: r.len })
                .collect();
            let head = HeadBlock {
                q: &q[b.row * ldq + h * d..],
                ldq,
                rows: b.rows,
                runs: &kv,
                ldk: d,
                head_dim: d,
                causal: Causal { diag: b.offset, step: 1 },
                scale,
            };
            let mut grads = Grads {
                o: &o[b.row * ldo + h * d..],
                d_o: &d_o[b.row * ldo + h * d..],
                ldo,
                lse: &lse[b.row * hq + h..],
                lse_stride: hq,
                dq,
                ldq: ldq_out,
                dk: dk_g,
                dv: dv_g,
                ldkv: d,
                starts: &starts,
            };
            backward(&head, &mut grads, sc);
        };
    // Query blocks in parallel, in fixed runs of blocks (`reduction_run`), each run summing its
    // own dK / dV over just the keys its blocks see (`[Hk][keys][d]`; a run of a packed row's
    // blocks sees a few of its sequences, not the whole row), the runs' sums then added in order
    // (bit-stable). (A thread per head group, with nothing to sum, measured slower.)
    let per_run = crate::cpu::reduction_run(blocks.len());
    let block_ids: Vec<usize> = (0..blocks.len()).collect();
    let dq_runs =
        split_chunks(dq, block_ids.chunks(per_run).map(|ids| ids.iter().map(|&i| blocks[i].rows * ldq_out).sum()));
    let partials: Vec<(std::ops::Range<usize>, Vec<f32>, Vec<f32>)> = block_ids
        .par_chunks(per_run)
        .zip(dq_runs)
        .map(|(ids, dq_run)| {
            let seen = ids.iter().flat_map(|&i| runs[i].iter().map(|r| r.start..r.start + r.len));
            let (lo, hi) = seen.fold((t, 0), |(lo, hi), r| (lo.min(r.start), hi.max(r.end)));
            let (lo, span) = (lo.min(hi), hi.saturating_sub(lo));
            let (mut dk_r, mut dv_r) = (vec![0f32; hk * span * d], vec![0f32; hk * span * d]);
            let mut sc = Scratch::default();
            let mut dq_at = 0;
            for &i in ids {
                for h in 0..hq {
                    let at = shape.group(h) * span * d;
                    let dq_blk = &mut dq_run[dq_at + h * d..];
                    head_block(i, h, dq_blk, lo, &mut dk_r[at..], &mut dv_r[at..], &mut sc);
                }
                dq_at += blocks[i].rows * ldq_out;
            }
            (lo..lo + span, dk_r, dv_r)
        })
        .collect();
    let ldkv = shape.ldk();
    for (keys, dk_r, dv_r) in &partials {
        for (src, dst) in [(dk_r, &mut *dk), (dv_r, &mut *dv)] {
            for (gi, block) in src.chunks_exact(keys.len() * d).enumerate() {
                for (tok, r) in keys.clone().zip(block.chunks_exact(d)) {
                    let out = &mut dst[tok * ldkv + gi * d..][..d];
                    out.iter_mut().zip(r).for_each(|(a, b)| *a += *b);
                }
            }
        }
    }
    true
}

/// Forward of one head block into `out` (stride `ldo`) and `lse[i * lse_stride]`; false (nothing
/// written) when the head width does not suit the SIMD width.
pub(crate) fn forward(
    h: &HeadBlock<'_>,
    out: &mut [f32],
    ldo: usize,
    lse: &mut [f32],
    lse_stride: usize,
    sc: &mut Scratch,
) -> bool {
    struct Op<'a, 'b> {
        h: &'a HeadBlock<'b>,
        out: &'a mut [f32],
        ldo: usize,
        lse: &'a mut [f32],
        lse_stride: usize,
        sc: &'a mut Scratch,
    }
    impl WithSimd for Op<'_, '_> {
        type Output = bool;
        #[inline(always)]
        fn with_simd<S: Simd>(self, simd: S) -> bool {
            let Op { h, out, ldo, lse, lse_stride, sc } = self;
            macro_rules! go {
                ($vd:literal, $r:literal) => {
                    forward_head::<S, $vd, $r>(simd, h, out, ldo, lse, lse_stride, sc)
                };
            }
            match tiling::<S>(h.head_dim) {
                Some((2, true)) => go!(2, 8),
                Some((4, true)) => go!(4, 4),
                Some((8, true)) => go!(8, 2),
                Some((1, false)) => go!(1, 8),
                Some((2, false)) => go!(2, 4),
                Some((4, false)) => go!(4, 2),
                Some((8, false)) => go!(8, 1),
                _ => return false,
            }
            true
        }
    }
    super::simd::arch().dispatch(Op { h, out, ldo, lse, lse_stride, sc })
}

/// Backward of one head block (see [`Grads`]); false (nothing written) when the head width does
/// not suit the SIMD width.
pub(crate) fn backward(h: &HeadBlock<'_>, g: &mut Grads<'_>, sc: &mut Scratch) -> bool {
    struct Op<'a, 'b, 'c> {
        h: &'a HeadBlock<'b>,
        g: &'a mut Grads<'c>,
        sc: &'a mut Scratch,
    }
    impl WithSimd for Op<'_, '_, '_> {
        type Output = bool;
        #[inline(always)]
        fn with_simd<S: Simd>(self, simd: S) -> bool {
            let Op { h, g, sc } = self;
            macro_rules! go {
                ($vd:literal, $r:literal) => {
                    backward_head::<S, $vd, $r>(simd, h, g, sc)
                };
            }
            match tiling::<S>(h.head_dim) {
                Some((2, true)) => go!(2, 8),
                Some((4, true)) => go!(4, 4),
                Some((8, true)) => go!(8, 2),
                Some((1, false)) => go!(1, 8),
                Some((2, false)) => go!(2, 4),
                Some((4, false)) => go!(4, 2),
                Some((8, false)) => go!(8, 1),
                _ => return false,
            }
            true
        }
    }
    super::simd::arch().dispatch(Op { h, g, sc })
}

#[inline(always)]
fn forward_head<S: Simd, const VD: usize, const R: usize>(
    simd: S,
    h: &HeadBlock<'_>,
    out: &mut [f32],
    ldo: usize,
    lse: &mut [f32],
    lse_stride: usize,
    sc: &mut Scratch,
) {
    let (qt_w, d) = (2 * S::F32_LANES, VD * S::F32_LANES);
    sc.st.resize(CHUNK * qt_w, 0.0);
    let mut r0 = 0;
    while r0 < h.rows {
        let nq = qt_w.min(h.rows - r0);
        load_tile(h.q, h.ldq, d, r0, nq, qt_w, h.scale, &mut sc.qt);
        sc.acc.clear();
        sc.acc.resize(qt_w * d, 0.0);
        sc.m.clear();
        sc.m.resize(qt_w, f32::NEG_INFINITY);
        sc.l.clear();
        sc.l.resize(qt_w, 0.0);
        sc.alpha.resize(qt_w, 0.0);
        for (ri, run) in h.runs.iter().enumerate() {
            let causal = ri + 1 == h.runs.len();
            let (len, unmasked) =
                if causal { causal_span(h.causal, run.len, r0, nq, qt_w, &mut sc.limit) } else { (run.len, run.len) };
            let mut j0 = 0;
            while j0 < len {
                let n = CHUNK.min(len - j0);
                let st = &mut sc.st[..n * qt_w];
                scores(simd, &sc.qt, d, &run.k[j0 * h.ldk..], h.ldk, n, st);
                if causal && j0 + n > unmasked {
                    mask(st, qt_w, j0, n, &sc.limit);
                }
                online_softmax(st, qt_w, &mut sc.m, &mut sc.l, &mut sc.alpha);
                for (row, &a) in sc.acc.chunks_exact_mut(d).zip(&sc.alpha).take(nq) {
                    if a != 1.0 {
                        row.iter_mut().for_each(|x| *x *= a);
                    }
                }
                accumulate::<S, VD, R>(simd, &mut sc.acc, d, nq, st, 1, qt_w, &run.v[j0 * h.ldk..], h.ldk, n);
                j0 += n;
            }
        }
        for i in 0..nq {
            let inv = 1.0 / sc.l[i];
            let row = &mut out[(r0 + i) * ldo..][..d];
            for (o, &a) in row.iter_mut().zip(&sc.acc[i * d..(i + 1) * d]) {
                *o = a * inv;
            }
            lse[(r0 + i) * lse_stride] = sc.m[i] + sc.l[i].ln();
        }
        r0 += nq;
    }
}

#[inline(always)]
fn backward_head<S: Simd, const VD: usize, const R: usize>(
    simd: S,
    h: &HeadBlock<'_>,
    g: &mut Grads<'_>,
    sc: &mut Scratch,
) {
    let (qt_w, d) = (2 * S::F32_LANES, VD * S::F32_LANES);
    sc.st.resize(CHUNK * qt_w, 0.0);
    sc.dst.resize(CHUNK * qt_w, 0.0);
    let mut r0 = 0;
    while r0 < h.rows {
        let nq = qt_w.min(h.rows - r0);
        load_tile(h.q, h.ldq, d, r0, nq, qt_w, h.scale, &mut sc.qt);
        load_tile(g.d_o, g.ldo, d, r0, nq, qt_w, 1.0, &mut sc.dot);
        sc.lse.clear();
        sc.lse.resize(qt_w, 0.0);
        sc.di.clear();
        sc.di.resize(qt_w, 0.0);
        for i in 0..nq {
            sc.lse[i] = g.lse[(r0 + i) * g.lse_stride];
            let (o, d_o) = (&g.o[(r0 + i) * g.ldo..][..d], &g.d_o[(r0 + i) * g.ldo..][..d]);
            sc.di[i] = crate::cpu::simd::dot(o, d_o);
        }
        sc.acc.clear();
        sc.acc.resize(qt_w * d, 0.0);
        for (rows, src, ld) in [(&mut sc.q_rows, h.q, h.ldq), (&mut sc.do_rows, g.d_o, g.ldo)] {
            rows.clear();
            for i in 0..nq {
                rows.extend_from_slice(&src[(r0 + i) * ld..][..d]);
            }
        }
        for (ri, run) in h.runs.iter().enumerate() {
            let causal = ri + 1 == h.runs.len();
            let (len, unmasked) =
                if causal { causal_span(h.causal, run.len, r0, nq, qt_w, &mut sc.limit) } else { (run.len, run.len) };
            let mut j0 = 0;
            while j0 < len {
                let n = CHUNK.min(len - j0);
                let (k, v) = (&run.k[j0 * h.ldk..], &run.v[j0 * h.ldk..]);
                let st = &mut sc.st[..n * qt_w];
                scores(simd, &sc.qt, d, k, h.ldk, n, st);
                if causal && j0 + n > unmasked {
                    mask(st, qt_w, j0, n, &sc.limit);
                }
                let dst = &mut sc.dst[..n * qt_w];
                scores(simd, &sc.dot, d, v, h.ldk, n, dst);
                // P = exp(S - lse); dS = scale * P * (dP - rowsum(dO * O)).
                for (prow, dsrow) in st.chunks_exact_mut(qt_w).zip(dst.chunks_exact_mut(qt_w)) {
                    for (((p, ds), &l), &di) in prow.iter_mut().zip(dsrow.iter_mut()).zip(&sc.lse).zip(&sc.di) {
                        *p = exp_f32(*p - l);
                        *ds = h.scale * *p * (*ds - di);
                    }
                }
                let row0 = (g.starts[ri] + j0) * g.ldkv;
                accumulate::<S, VD, R>(simd, &mut g.dv[row0..], g.ldkv, n, st, qt_w, 1, &sc.do_rows, d, nq);
                accumulate::<S, VD, R>(simd, &mut g.dk[row0..], g.ldkv, n, dst, qt_w, 1, &sc.q_rows, d, nq);
                accumulate::<S, VD, R>(simd, &mut sc.acc, d, nq, dst, 1, qt_w, k, h.ldk, n);
                j0 += n;
            }
        }
        for i in 0..nq {
            g.dq[(r0 + i) * g.ldq..][..d].copy_from_slice(&sc.acc[i * d..(i + 1) * d]);
        }
        r0 += nq;
    }
}
