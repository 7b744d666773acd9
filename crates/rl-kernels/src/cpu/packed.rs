//! Dense layers whose weights are packed once, for the inference runtime: `y (+)= x W^T` with an
//! HF weight `W [out, in]` rearranged into panels of `NR` output columns (`[in][NR]`, the last
//! panel zero-padded). A general GEMM (the `gemm` crate) repacks the weight on every call, which
//! for the few rows of a decode step reads and writes the whole weight twice; here each call only
//! streams the panels. Register tiles of `MR` rows x `NR` columns accumulate over all of `in` with
//! FMAs, compiled for the widest SIMD the CPU has (AVX-512: 12 x 32, AVX2: 4 x 16).
//!
//! A weight can also be packed in bf16 ([`PackedLinear::new_bf16`]): half the bytes, so twice the
//! tokens a second where decoding is bound by memory bandwidth (one sequence reads every weight
//! once per token). Two bf16 values of consecutive inputs share one 32-bit word, so widening a
//! value to f32 is one mask or one shift; products still accumulate in f32. A weight whose every
//! value already is a bf16 value (a checkpoint stored in bf16, as released models are, loaded in
//! f32) is packed so by [`PackedLinear::new`] too: the bf16 tile accumulates the same products in
//! the same order as the f32 tile, so the result is the same to the bit at half the bytes.

use pulp::{Simd, WithSimd};

use super::prefetch;

/// Products of at least this many multiply-adds are split across the thread pool.
const PARALLEL_MIN_MACS: usize = 1 << 15;

/// A weight packed for [`PackedLinear::apply`].
#[derive(Debug, Clone)]
pub struct PackedLinear {
    out: usize,
    inp: usize,
    /// Columns per panel: two SIMD vectors of the CPU this was packed on.
    nr: usize,
    /// `ceil(out / nr)` panels of `inp * nr` values.
    panels: Values,
}

/// The packed values.
#[derive(Debug, Clone)]
enum Values {
    F32(Vec<f32>),
    /// `ceil(inp / 2) * nr` words a panel: word `[j][c]` holds column c's bf16 weights of inputs
    /// `2j` (high half) and `2j + 1` (low half; zero past the last input).
    Bf16(Vec<u32>),
}

/// `x` rounded to the nearest bf16 (ties to even), as its 16 bits.
pub fn bf16_bits(x: f32) -> u16 {
    if x.is_nan() {
        return 0x7FC0;
    }
    let b = x.to_bits();
    ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

/// The f32 value of bf16 bits.
pub fn bf16_value(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// f32 lanes of the widest SIMD available at run time.
fn simd_lanes() -> usize {
    struct Lanes;
    impl WithSimd for Lanes {
        type Output = usize;
        #[inline(always)]
        fn with_simd<S: Simd>(self, _: S) -> usize {
            S::F32_LANES
        }
    }
    super::simd::arch().dispatch(Lanes)
}

/// Whether `v` is exactly a bf16 value (its low 16 bits are zero; NaNs aside, which no weight is).
fn exact_in_bf16(v: f32) -> bool {
    v.to_bits() & 0xFFFF == 0
}

impl PackedLinear {
    /// Packs `w` (`out` rows of `inp`, row-major as HF stores it): in f32, or in bf16 when every
    /// value of `w` is exactly a bf16 value (lossless: see the module's doc).
    pub fn new(w: &[f32], out: usize, inp: usize) -> Self {
        if w.iter().all(|&v| exact_in_bf16(v)) {
            return Self::new_bf16(w, out, inp);
        }
        Self::new_f32(w, out, inp)
    }

    /// Packs `w` in f32 whatever its values.
    fn new_f32(w: &[f32], out: usize, inp: usize) -> Self {
        Self::pack_f32(w, out, inp, 2 * simd_lanes())
    }

    /// Packs `w` in f32 into panels of `nr` columns.
    fn pack_f32(w: &[f32], out: usize, inp: usize, nr: usize) -> Self {
        assert_eq!(w.len(), out * inp, "weight of {} values is not [{out}, {inp}]", w.len());
        let n_panels = out.div_ceil(nr);
        let mut panels = vec![0f32; n_panels * inp * nr];
        for (p, panel) in panels.chunks_mut(inp * nr).enumerate() {
            for c in 0..nr.min(out - p * nr) {
                let row = &w[(p * nr + c) * inp..][..inp];
                for (k, &v) in row.iter().enumerate() {
                    panel[k * nr + c] = v;
                }
            }
        }
        PackedLinear { out, inp, nr, panels: Values::F32(panels) }
    }

    /// Packs `w` with every weight rounded to bf16 (see the module's doc).
    pub fn new_bf16(w: &[f32], out: usize, inp: usize) -> Self {
        Self::pack_bf16(w, out, inp, 2 * simd_lanes())
    }

    /// Packs `w` rounded to bf16 into panels of `nr` columns.
    fn pack_bf16(w: &[f32], out: usize, inp: usize, nr: usize) -> Self {
        assert_eq!(w.len(), out * inp, "weight of {} values is not [{out}, {inp}]", w.len());
        let (n_panels, pairs) = (out.div_ceil(nr), inp.div_ceil(2));
        let mut panels = vec![0u32; n_panels * pairs * nr];
        for (p, panel) in panels.chunks_mut(pairs * nr).enumerate() {
            for c in 0..nr.min(out - p * nr) {
                let row = &w[(p * nr + c) * inp..][..inp];
                for (j, pair) in row.chunks(2).enumerate() {
                    let hi = u32::from(bf16_bits(pair[0])) << 16;
                    let lo = pair.get(1).map_or(0, |&v| u32::from(bf16_bits(v)));
                    panel[j * nr + c] = hi | lo;
                }
            }
        }
        PackedLinear { out, inp, nr, panels: Values::Bf16(panels) }
    }

    /// Whether the weights are held in bf16.
    pub fn is_bf16(&self) -> bool {
        matches!(self.panels, Values::Bf16(_))
    }

    /// Bytes of the packed weights (what one pass over them reads).
    pub fn bytes(&self) -> usize {
        match &self.panels {
            Values::F32(v) => std::mem::size_of_val(&v[..]),
            Values::Bf16(v) => std::mem::size_of_val(&v[..]),
        }
    }

    /// Output columns.
    pub fn out(&self) -> usize {
        self.out
    }

    /// Input columns.
    pub fn inp(&self) -> usize {
        self.inp
    }

    /// `y [m, out] (+)= x [m, in] W^T` (accumulating onto `y` when `accumulate`).
    pub fn apply(&self, y: &mut [f32], x: &[f32], m: usize, accumulate: bool) {
        assert!(x.len() >= m * self.inp && y.len() >= m * self.out, "buffers too small for {m} rows");
        let n_panels = self.out.div_ceil(self.nr);
        let mut rows: Vec<&mut [f32]> = y.chunks_mut(self.out).take(m).collect();
        let threads = rayon::current_num_threads();
        let split = threads >= 2 && n_panels >= 2 && m * self.inp * self.out >= PARALLEL_MIN_MACS;
        let parts = if split { threads.min(n_panels) } else { 1 };
        self.panel_ranges(&mut rows, 0..n_panels, parts, x, accumulate);
    }

    /// Panels `range` into the row segments `rows` (column 0 of each = the range's first column),
    /// split into `parts` column ranges that run side by side (each row's segment is split where
    /// the ranges meet, so every thread writes its own columns in place).
    fn panel_ranges(
        &self,
        rows: &mut [&mut [f32]],
        range: std::ops::Range<usize>,
        parts: usize,
        x: &[f32],
        accumulate: bool,
    ) {
        if parts <= 1 || range.len() < 2 {
            super::simd::arch().dispatch(Panels { w: self, rows, range, x, accumulate });
            return;
        }
        let left = parts / 2;
        let mid = range.start + range.len() * left / parts;
        let cut = (mid - range.start) * self.nr;
        let (mut lo, mut hi): (Vec<&mut [f32]>, Vec<&mut [f32]>) = rows
            .iter_mut()
            .map(|r| {
                let (a, b) = std::mem::take(r).split_at_mut(cut);
                (a, b)
            })
            .unzip();
        rayon::join(
            || self.panel_ranges(&mut lo, range.start..mid, left, x, accumulate),
            || self.panel_ranges(&mut hi, mid..range.end, parts - left, x, accumulate),
        );
    }
}

struct Panels<'a, 'r> {
    w: &'a PackedLinear,
    /// One segment per row of the product (`m` rows), starting at the range's first column.
    rows: &'a mut [&'r mut [f32]],
    range: std::ops::Range<usize>,
    x: &'a [f32],
    accumulate: bool,
}

/// Calls `$f::<MR>` for the row count `$rows` (1..=12) as a compile-time constant.
macro_rules! with_rows {
    ($rows:expr, $f:ident, $($arg:expr),*) => {
        match $rows {
            1 => $f::<S, 1>($($arg),*),
            2 => $f::<S, 2>($($arg),*),
            3 => $f::<S, 3>($($arg),*),
            4 => $f::<S, 4>($($arg),*),
            5 => $f::<S, 5>($($arg),*),
            6 => $f::<S, 6>($($arg),*),
            7 => $f::<S, 7>($($arg),*),
            8 => $f::<S, 8>($($arg),*),
            9 => $f::<S, 9>($($arg),*),
            10 => $f::<S, 10>($($arg),*),
            11 => $f::<S, 11>($($arg),*),
            _ => $f::<S, 12>($($arg),*),
        }
    };
}

impl WithSimd for Panels<'_, '_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let Panels { w, rows, range, x, accumulate } = self;
        let (nr, k, m) = (w.nr, w.inp, rows.len());
        if nr != 2 * S::F32_LANES {
            // Packed for another instruction set (cannot happen within one process).
            return scalar(w, rows, range, x, accumulate);
        }
        // Rows per register tile: 2 * MR accumulators + 2 weight vectors + the broadcasts must
        // fit the register file (32 vectors with AVX-512, 16 with AVX2). At 6 rows with AVX2 the
        // compiler spilled an accumulator to the stack on every step of the loop (while the loop
        // still had bounds checks: see `tile`); 4 rows (two passes over a panel for 8 sequences,
        // the second from cache) ran products of 8 rows at 1.3-1.75x the speed (2-core AMD EPYC,
        // products of the 0.6B shape's layers). Retried without the checks (`RL_SIMD=avx2` on a
        // Zen 5): 6-row f32 tiles no longer spill, but 8 rows (6 + 2) ran 5% slower than 4 + 4
        // and the 6-row bf16 tile still spills (docs/benchmarks.md).
        let mr = if S::F32_LANES >= 16 { 12 } else { 4 };
        let interleaved;
        let x = if m == 1 {
            x
        } else {
            interleaved = interleave_rows(x, m, k, mr);
            &interleaved[..]
        };
        let c_first = range.start * nr;
        let last = range.end;
        for p in range {
            let (c0, cols) = (p * nr - c_first, nr.min(w.out - p * nr));
            let mut r0 = 0;
            while r0 < m {
                let n = mr.min(m - r0);
                let xs = &x[r0 * k..][..n * k];
                let ys = &mut rows[r0..r0 + n];
                // Each tile prefetches its share of the next panel's lines, so the memory bus
                // keeps streaming while a tile computes from cache. A single row of f32 weights
                // streams at the bus's rate and the hardware prefetcher does better alone
                // (batch-1 decode at the 0.6B shape, 2-core AMD EPYC: 8.9 -> 7.6 tok/s with it);
                // every tile that computes more per byte needs it: bf16 weights (14 -> 16-20
                // tok/s), 8 f32 rows in two AVX2 passes (38-43 -> 44-48), and one AVX-512 pass
                // of 2-12 f32 rows (the 28 layers' products, 2-core Intel Xeon: 8 rows 108 -> 87
                // ms, 4 rows 88 -> 80-85, 2 rows 74 -> 67-69; `cargo bench --bench packed`).
                // An AVX-512 panel row is two cache lines and both are fetched: fetching the
                // first alone left half of each panel to the bus's latency (Intel Xeon, medians
                // of eight alternated runs: f32 4 rows 103 -> 88 ms, 8 rows 115 -> 95).
                let passes = m.div_ceil(mr);
                let ahead = (m > 1 || w.is_bf16()) && p + 1 < last;
                let pre = Ahead { passes, pass: r0 / mr };
                match &w.panels {
                    Values::F32(all) => {
                        let panel = &all[p * k * nr..][..k * nr];
                        let next = if ahead { &all[(p + 1) * k * nr..][..k * nr] } else { &[][..] };
                        with_rows!(n, tile, simd, panel, next, pre, xs, k, ys, c0, cols, accumulate);
                    }
                    Values::Bf16(all) => {
                        let words = k.div_ceil(2) * nr;
                        let panel = &all[p * words..][..words];
                        let next = if ahead { &all[(p + 1) * words..][..words] } else { &[][..] };
                        with_rows!(n, tile_bf16, simd, panel, next, pre, xs, k, ys, c0, cols, accumulate);
                    }
                }
                r0 += n;
            }
        }
    }
}

/// `x` (`m` rows of `k`) in row tiles of `mr`, each tile's rows interleaved (`[k][rows]`): a tile
/// reads step `kk`'s inputs as one `[f32; MR]`, at constant offsets from one pointer, with no
/// bounds check in its loop (see [`tile`]).
fn interleave_rows(x: &[f32], m: usize, k: usize, mr: usize) -> Vec<f32> {
    let mut out = vec![0f32; m * k];
    for r0 in (0..m).step_by(mr) {
        let n = mr.min(m - r0);
        let tile = &mut out[r0 * k..][..n * k];
        for i in 0..n {
            for (kk, &v) in x[(r0 + i) * k..][..k].iter().enumerate() {
                tile[kk * n + i] = v;
            }
        }
    }
    out
}

/// Which lines of the next panel a tile prefetches: those `pass`, `pass + passes`, ... (each of
/// the `passes` row tiles over a panel fetches its share, so memory streams all the while).
#[derive(Clone, Copy)]
struct Ahead {
    passes: usize,
    pass: usize,
}

/// One `MR x NR` tile: `MR` rows interleaved in `x` (`[k][MR]`) against one panel, into columns
/// `c0..c0 + cols` (`cols <= NR`) of the row segments `ys`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn tile<S: Simd, const MR: usize>(
    simd: S,
    panel: &[f32],
    next: &[f32],
    pre: Ahead,
    x: &[f32],
    k: usize,
    ys: &mut [&mut [f32]],
    c0: usize,
    cols: usize,
    accumulate: bool,
) {
    let (w, _) = S::as_simd_f32s(panel);
    let zero = simd.splat_f32s(0.0);
    let mut acc = [[zero; 2]; MR];
    let (xk, _) = x.as_chunks::<MR>();
    // Nothing in this loop may panic. With bounds-checked indexing (`w[2 * kk]`, a row slice's
    // `[kk]`) LLVM kept the 12-row tile's accumulators in registers but also stored all 24 of them
    // to the stack at every step, one 64-byte store per FMA: products of 12 to 64 rows (prompts,
    // large batches) ran at 160-200 GFLOP/s instead of 410-460 (the 0.6B shape's layers, 2-core
    // Zen 5; 11 rows and fewer were not affected).
    // No next panel: never due (the branch then costs nothing in the streaming loop).
    let mut due = if next.is_empty() { usize::MAX } else { pre.pass };
    for (kk, (xr, wr)) in xk[..k].iter().zip(w.as_chunks::<2>().0).enumerate() {
        if kk == due {
            prefetch::span_to_l2(next, kk * 2 * S::F32_LANES, 2 * S::F32_LANES);
            due += pre.passes;
        }
        let [w0, w1] = *wr;
        for i in 0..MR {
            let b = simd.splat_f32s(xr[i]);
            acc[i][0] = simd.mul_add_f32s(b, w0, acc[i][0]);
            acc[i][1] = simd.mul_add_f32s(b, w1, acc[i][1]);
        }
    }
    store::<S, MR>(&acc, ys, c0, cols, accumulate);
}

/// [`tile`] over a bf16 panel: each word gives the weights of two consecutive inputs.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn tile_bf16<S: Simd, const MR: usize>(
    simd: S,
    panel: &[u32],
    next: &[u32],
    pre: Ahead,
    x: &[f32],
    k: usize,
    ys: &mut [&mut [f32]],
    c0: usize,
    cols: usize,
    accumulate: bool,
) {
    let (w, _) = S::as_simd_u32s(panel);
    let zero = simd.splat_f32s(0.0);
    let (high, sixteen) = (simd.splat_u32s(0xFFFF_0000), simd.splat_u32s(16));
    let mut acc = [[zero; 2]; MR];
    let (xk, _) = x.as_chunks::<MR>();
    let xk = &xk[..k];
    let widen = |word: S::u32s| {
        let even = simd.transmute_f32s_u32s(simd.and_u32s(word, high));
        let odd = simd.transmute_f32s_u32s(simd.wrapping_dyn_shl_u32s(word, sixteen));
        (even, odd)
    };
    let mut due = if next.is_empty() { usize::MAX } else { pre.pass };
    let (pairs, last) = xk.as_chunks::<2>();
    let (words, _) = w.as_chunks::<2>();
    for (j, ([xa, xb], [w0, w1])) in pairs.iter().zip(words).enumerate() {
        if j == due {
            prefetch::span_to_l2(next, j * 2 * S::F32_LANES, 2 * S::F32_LANES);
            due += pre.passes;
        }
        let ((e0, o0), (e1, o1)) = (widen(*w0), widen(*w1));
        for i in 0..MR {
            let (a, b) = (simd.splat_f32s(xa[i]), simd.splat_f32s(xb[i]));
            acc[i][0] = simd.mul_add_f32s(b, o0, simd.mul_add_f32s(a, e0, acc[i][0]));
            acc[i][1] = simd.mul_add_f32s(b, o1, simd.mul_add_f32s(a, e1, acc[i][1]));
        }
    }
    if let ([xa], Some([w0, w1])) = (last, words.get(k / 2)) {
        let ((e0, _), (e1, _)) = (widen(*w0), widen(*w1));
        for i in 0..MR {
            let a = simd.splat_f32s(xa[i]);
            acc[i][0] = simd.mul_add_f32s(a, e0, acc[i][0]);
            acc[i][1] = simd.mul_add_f32s(a, e1, acc[i][1]);
        }
    }
    store::<S, MR>(&acc, ys, c0, cols, accumulate);
}

/// Writes (or adds) tile accumulators into columns `c0..c0 + cols` of the row segments `ys`.
#[inline(always)]
fn store<S: Simd, const MR: usize>(
    acc: &[[S::f32s; 2]; MR],
    ys: &mut [&mut [f32]],
    c0: usize,
    cols: usize,
    accumulate: bool,
) {
    for (a, y) in acc.iter().zip(ys.iter_mut()) {
        let yr = &mut y[c0..c0 + cols];
        let mut vals = [0f32; 64];
        let (v, _) = S::as_mut_simd_f32s(&mut vals[..2 * S::F32_LANES]);
        v[0] = a[0];
        v[1] = a[1];
        if accumulate {
            yr.iter_mut().zip(&vals).for_each(|(d, s)| *d += s);
        } else {
            yr.copy_from_slice(&vals[..cols]);
        }
    }
}

/// The same product without SIMD (packing and use on different instruction sets).
fn scalar(w: &PackedLinear, rows: &mut [&mut [f32]], range: std::ops::Range<usize>, x: &[f32], accumulate: bool) {
    let (nr, k) = (w.nr, w.inp);
    let c_first = range.start * nr;
    let weight = |p: usize, kk: usize, c: usize| match &w.panels {
        Values::F32(all) => all[p * k * nr + kk * nr + c],
        Values::Bf16(all) => {
            let word = all[p * k.div_ceil(2) * nr + (kk / 2) * nr + c];
            bf16_value(if kk.is_multiple_of(2) { (word >> 16) as u16 } else { word as u16 })
        }
    };
    for p in range {
        for c in 0..nr.min(w.out - p * nr) {
            for (r, y) in rows.iter_mut().enumerate() {
                let s: f32 = (0..k).map(|kk| x[r * k + kk] * weight(p, kk, c)).sum();
                let d = &mut y[p * nr - c_first + c];
                *d = if accumulate { *d + s } else { s };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(x: &[f32], w: &[f32], m: usize, inp: usize, out: usize) -> Vec<f64> {
        let mut y = vec![0f64; m * out];
        for r in 0..m {
            for c in 0..out {
                y[r * out + c] = (0..inp).map(|k| f64::from(x[r * inp + k]) * f64::from(w[c * inp + k])).sum();
            }
        }
        y
    }

    #[test]
    fn packed_products_match_the_definition_for_every_tile_shape() {
        // Row counts around the tile heights, column counts around the panel widths, serial and
        // parallel sizes, assignment and accumulation.
        for (m, inp, out) in [
            (1, 7, 5),
            (3, 16, 33),
            (13, 64, 70),
            (25, 32, 16),
            (32, 256, 300),
            (1, 512, 1024),
            (8, 40, 21),
            (6, 33, 40),
        ] {
            let x: Vec<f32> = (0..m * inp).map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0).collect();
            let w: Vec<f32> = (0..out * inp).map(|i| ((i * 53 % 97) as f32 - 48.0) / 40.0).collect();
            let packed = PackedLinear::new(&w, out, inp);
            assert!(!packed.is_bf16(), "these weights are not all exact in bf16: the f32 tiles are under test");
            let want = reference(&x, &w, m, inp, out);
            let mut y = vec![f32::NAN; m * out];
            packed.apply(&mut y, &x, m, false);
            for (i, (a, b)) in y.iter().zip(&want).enumerate() {
                assert!((f64::from(*a) - b).abs() < 1e-4 * (1.0 + b.abs()), "({m},{inp},{out}) [{i}] {a} vs {b}");
            }
            packed.apply(&mut y, &x, m, true);
            for (a, b) in y.iter().zip(&want) {
                assert!((f64::from(*a) - 2.0 * b).abs() < 2e-4 * (1.0 + b.abs()));
            }
            let mut s = vec![0f32; m * out];
            let mut rows: Vec<&mut [f32]> = s.chunks_mut(out).collect();
            scalar(&packed, &mut rows, 0..out.div_ceil(packed.nr), &x, false);
            for (a, b) in s.iter().zip(&want) {
                assert!((f64::from(*a) - b).abs() < 1e-4 * (1.0 + b.abs()));
            }
        }
    }

    #[test]
    fn bf16_packed_products_equal_the_product_with_rounded_weights() {
        // Odd input counts leave the last word half empty.
        for (m, inp, out) in [(1, 7, 5), (3, 16, 33), (13, 63, 70), (4, 33, 40), (1, 512, 1024), (9, 1, 3)] {
            let x: Vec<f32> = (0..m * inp).map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0).collect();
            let w: Vec<f32> = (0..out * inp).map(|i| ((i * 53 % 97) as f32 - 48.0) / 40.0 + 1e-3).collect();
            let rounded: Vec<f32> = w.iter().map(|&v| bf16_value(bf16_bits(v))).collect();
            assert!(w.iter().zip(&rounded).any(|(a, b)| a != b), "the weights must not all be exact in bf16");
            let packed = PackedLinear::new_bf16(&w, out, inp);
            assert!(packed.is_bf16());
            let want = reference(&x, &rounded, m, inp, out);
            let mut y = vec![f32::NAN; m * out];
            packed.apply(&mut y, &x, m, false);
            for (i, (a, b)) in y.iter().zip(&want).enumerate() {
                assert!((f64::from(*a) - b).abs() < 1e-4 * (1.0 + b.abs()), "({m},{inp},{out}) [{i}] {a} vs {b}");
            }
            packed.apply(&mut y, &x, m, true);
            for (a, b) in y.iter().zip(&want) {
                assert!((f64::from(*a) - 2.0 * b).abs() < 2e-4 * (1.0 + b.abs()));
            }
            let mut s = vec![0f32; m * out];
            let mut rows: Vec<&mut [f32]> = s.chunks_mut(out).collect();
            scalar(&packed, &mut rows, 0..out.div_ceil(packed.nr), &x, false);
            for (a, b) in s.iter().zip(&want) {
                assert!((f64::from(*a) - b).abs() < 1e-4 * (1.0 + b.abs()));
            }
        }
    }

    #[test]
    fn weights_exact_in_bf16_are_packed_in_bf16_with_the_same_products_to_the_bit() {
        for (m, inp, out) in [(1, 7, 5), (3, 16, 33), (4, 33, 40), (8, 64, 70), (13, 63, 70), (1, 512, 1024)] {
            let x: Vec<f32> = (0..m * inp).map(|i| ((i * 37 % 101) as f32 - 50.0) / 47.0).collect();
            let w: Vec<f32> =
                (0..out * inp).map(|i| bf16_value(bf16_bits(((i * 53 % 97) as f32 - 48.0) / 41.0 + 1e-3))).collect();
            let (auto, f32s) = (PackedLinear::new(&w, out, inp), PackedLinear::new_f32(&w, out, inp));
            assert!(auto.is_bf16() && !f32s.is_bf16());
            for accumulate in [false, true] {
                let (mut a, mut b) = (vec![0.5f32; m * out], vec![0.5f32; m * out]);
                auto.apply(&mut a, &x, m, accumulate);
                f32s.apply(&mut b, &x, m, accumulate);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&b), "({m},{inp},{out}) accumulate {accumulate}");
            }
        }
        // One value off the bf16 grid keeps the whole weight in f32.
        let mut w = vec![0.25f32; 6 * 4];
        assert!(PackedLinear::new(&w, 6, 4).is_bf16());
        w[17] = 0.1;
        assert!(!PackedLinear::new(&w, 6, 4).is_bf16());
    }

    /// The AVX2 tiles (4 rows of 16 columns) on a machine with AVX-512 too, where `apply` would
    /// dispatch to the AVX-512 ones: every x86-64 kind the tiles run on gets its tiles tested.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_tiles_match_the_definition_wherever_avx2_runs() {
        let Some(v3) = pulp::x86::V3::try_new() else { return };
        for (m, inp, out) in [(1, 7, 5), (3, 16, 33), (4, 64, 70), (5, 63, 40), (9, 33, 17), (13, 40, 21)] {
            let x: Vec<f32> = (0..m * inp).map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0).collect();
            let w: Vec<f32> = (0..out * inp).map(|i| ((i * 53 % 97) as f32 - 48.0) / 40.0 + 1e-3).collect();
            let rounded: Vec<f32> = w.iter().map(|&v| bf16_value(bf16_bits(v))).collect();
            for (packed, weights) in
                [(PackedLinear::pack_f32(&w, out, inp, 16), &w), (PackedLinear::pack_bf16(&w, out, inp, 16), &rounded)]
            {
                let want = reference(&x, weights, m, inp, out);
                for accumulate in [false, true] {
                    let mut y = vec![if accumulate { 1.0 } else { f32::NAN }; m * out];
                    let mut rows: Vec<&mut [f32]> = y.chunks_mut(out).collect();
                    let range = 0..out.div_ceil(16);
                    Simd::vectorize(v3, Panels { w: &packed, rows: &mut rows, range, x: &x, accumulate });
                    let base = if accumulate { 1.0 } else { 0.0 };
                    for (i, (a, b)) in y.iter().zip(&want).enumerate() {
                        let b = b + base;
                        assert!(
                            (f64::from(*a) - b).abs() < 1e-4 * (1.0 + b.abs()),
                            "({m},{inp},{out}) [{i}] {a} vs {b}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn bf16_rounds_to_nearest_with_ties_to_even() {
        assert_eq!(bf16_value(bf16_bits(1.0)), 1.0);
        // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
        assert_eq!(bf16_value(bf16_bits(1.0 + 1.0 / 256.0)), 1.0);
        // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: to 1 + 2^-6 (even).
        assert_eq!(bf16_value(bf16_bits(1.0 + 3.0 / 256.0)), 1.0 + 1.0 / 64.0);
        assert_eq!(bf16_value(bf16_bits(1.0 + 1.5 / 256.0)), 1.0 + 1.0 / 128.0);
        assert_eq!(bf16_value(bf16_bits(-2.5)), -2.5);
        assert!(bf16_value(bf16_bits(f32::NAN)).is_nan());
        assert_eq!(bf16_value(bf16_bits(f32::INFINITY)), f32::INFINITY);
    }
}
