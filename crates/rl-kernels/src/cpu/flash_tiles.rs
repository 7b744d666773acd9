//! The register tiles and lane-wise pieces the fused attention kernel (`flash.rs`) is built from:
//! score tiles (keys x two SIMD vectors of queries), head-width product tiles, query tiles loaded
//! transposed, the causal span and mask of a tile, and one chunk of the online softmax.

use pulp::Simd;

use crate::cpu::attention_blocks::Causal;
use crate::cpu::simd::exp_f32;

/// Whether a tiling has an instantiation below.
pub(super) fn instantiated(t: Option<(usize, bool)>) -> bool {
    matches!(t, Some((2 | 4 | 8, true)) | Some((1 | 2 | 4 | 8, false)))
}

/// Vectors per head row, and whether the CPU has 32 vector registers (AVX-512) rather than 16,
/// for the widths this kernel is instantiated for.
pub(super) fn tiling<S: Simd>(d: usize) -> Option<(usize, bool)> {
    let lanes = S::F32_LANES;
    if lanes < 8 || !d.is_multiple_of(lanes) {
        return None;
    }
    Some((d / lanes, lanes >= 16))
}

/// Keys per score register tile: 8 x 2 vectors of accumulators with 32 registers, 4 x 2 with 16.
fn score_keys<S: Simd>() -> usize {
    if S::F32_LANES >= 16 { 8 } else { 4 }
}

/// `out[j][lane] = sum_i x[j][i] * yt[i][lane]` for keys `j < n` (rows of `x`, stride `ldx`) and
/// the `2 * lanes` query lanes of `yt` (`[d][2 lanes]`); `out` is `[n][2 lanes]`.
#[inline(always)]
pub(super) fn scores<S: Simd>(simd: S, yt: &[f32], d: usize, x: &[f32], ldx: usize, n: usize, out: &mut [f32]) {
    let qt = 2 * S::F32_LANES;
    let (y, _) = S::as_simd_f32s(&yt[..d * qt]);
    let mut j = 0;
    if score_keys::<S>() == 8 {
        while j + 8 <= n {
            score_tile::<S, 8>(simd, y, d, &x[j * ldx..], ldx, &mut out[j * qt..]);
            j += 8;
        }
    }
    while j + 4 <= n {
        score_tile::<S, 4>(simd, y, d, &x[j * ldx..], ldx, &mut out[j * qt..]);
        j += 4;
    }
    if j + 2 <= n {
        score_tile::<S, 2>(simd, y, d, &x[j * ldx..], ldx, &mut out[j * qt..]);
        j += 2;
    }
    while j < n {
        score_tile::<S, 1>(simd, y, d, &x[j * ldx..], ldx, &mut out[j * qt..]);
        j += 1;
    }
}

#[inline(always)]
fn score_tile<S: Simd, const NK: usize>(simd: S, y: &[S::f32s], d: usize, x: &[f32], ldx: usize, out: &mut [f32]) {
    let zero = simd.splat_f32s(0.0);
    let mut acc = [[zero; 2]; NK];
    let rows: [&[f32]; NK] = std::array::from_fn(|kk| &x[kk * ldx..kk * ldx + d]);
    let y = &y[..2 * d];
    for i in 0..d {
        let (y0, y1) = (y[2 * i], y[2 * i + 1]);
        for kk in 0..NK {
            let b = simd.splat_f32s(rows[kk][i]);
            acc[kk][0] = simd.mul_add_f32s(b, y0, acc[kk][0]);
            acc[kk][1] = simd.mul_add_f32s(b, y1, acc[kk][1]);
        }
    }
    let (o, _) = S::as_mut_simd_f32s(&mut out[..NK * 2 * S::F32_LANES]);
    for kk in 0..NK {
        o[2 * kk] = acc[kk][0];
        o[2 * kk + 1] = acc[kk][1];
    }
}

/// `out[r][:] += sum_j coef[r * cr + j * cj] * z[j][:]` for rows `r < rows` of `out` (stride
/// `ldo`) and `j < nj` rows of `z` (stride `ldz`), all of width `VD` vectors.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn accumulate<S: Simd, const VD: usize, const R: usize>(
    simd: S,
    out: &mut [f32],
    ldo: usize,
    rows: usize,
    coef: &[f32],
    cr: usize,
    cj: usize,
    z: &[f32],
    ldz: usize,
    nj: usize,
) {
    let mut r = 0;
    while r + R <= rows {
        accumulate_tile::<S, VD, R>(simd, &mut out[r * ldo..], ldo, &coef[r * cr..], cr, cj, z, ldz, nj);
        r += R;
    }
    // The remainder in tiles of 4, 2 and 1 rows (a row count like 30 would otherwise run 6
    // single-row tiles, whose loads outnumber their multiply-adds).
    if R > 4 && r + 4 <= rows {
        accumulate_tile::<S, VD, 4>(simd, &mut out[r * ldo..], ldo, &coef[r * cr..], cr, cj, z, ldz, nj);
        r += 4;
    }
    if R > 2 && r + 2 <= rows {
        accumulate_tile::<S, VD, 2>(simd, &mut out[r * ldo..], ldo, &coef[r * cr..], cr, cj, z, ldz, nj);
        r += 2;
    }
    while r < rows {
        accumulate_tile::<S, VD, 1>(simd, &mut out[r * ldo..], ldo, &coef[r * cr..], cr, cj, z, ldz, nj);
        r += 1;
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn accumulate_tile<S: Simd, const VD: usize, const R: usize>(
    simd: S,
    out: &mut [f32],
    ldo: usize,
    coef: &[f32],
    cr: usize,
    cj: usize,
    z: &[f32],
    ldz: usize,
    nj: usize,
) {
    let d = VD * S::F32_LANES;
    let zero = simd.splat_f32s(0.0);
    let mut acc = [[zero; VD]; R];
    for (r, a) in acc.iter_mut().enumerate() {
        let (o, _) = S::as_simd_f32s(&out[r * ldo..r * ldo + d]);
        a.copy_from_slice(&o[..VD]);
    }
    // Step j's R factors sit at constant offsets (cr is a constant once inlined) from one base:
    // one bounds check per step, then plain displacements.
    let span = (R - 1) * cr + 1;
    for j in 0..nj {
        let c = &coef[j * cj..j * cj + span];
        let (zr, _) = S::as_simd_f32s(&z[j * ldz..j * ldz + d]);
        let zr = &zr[..VD];
        for r in 0..R {
            let b = simd.splat_f32s(c[r * cr]);
            for v in 0..VD {
                acc[r][v] = simd.mul_add_f32s(b, zr[v], acc[r][v]);
            }
        }
    }
    for (r, a) in acc.iter().enumerate() {
        let (o, _) = S::as_mut_simd_f32s(&mut out[r * ldo..r * ldo + d]);
        o[..VD].copy_from_slice(a);
    }
}

/// Rows `r0..r0 + nq` of `src` (stride `ld`, width `d`) transposed into `out` (`[d][qt_w]`,
/// times `scale`, padding lanes 0).
#[allow(clippy::too_many_arguments)]
pub(super) fn load_tile(
    src: &[f32],
    ld: usize,
    d: usize,
    r0: usize,
    nq: usize,
    qt_w: usize,
    scale: f32,
    out: &mut Vec<f32>,
) {
    out.clear();
    out.resize(d * qt_w, 0.0);
    #[cfg(target_arch = "x86_64")]
    if d.is_multiple_of(8)
        && qt_w.is_multiple_of(8)
        && let Some(v3) = pulp::x86::V3::try_new()
    {
        // In 8 x 8 blocks, each transposed in registers (unpack, shuffle, lane permute): the
        // scalar loop's strided stores cost about as much as a short segment's score tiles.
        return v3.vectorize(|| {
            use core::arch::x86_64::__m256;
            let a = v3.avx;
            let scale: __m256 = pulp::cast([scale; 8]);
            for lb in (0..nq).step_by(8) {
                for cb in (0..d).step_by(8) {
                    let r: [__m256; 8] = std::array::from_fn(|j| {
                        if lb + j < nq {
                            let row: [f32; 8] = src[(r0 + lb + j) * ld + cb..][..8].try_into().expect("8 values");
                            a._mm256_mul_ps(pulp::cast(row), scale)
                        } else {
                            pulp::cast([0f32; 8])
                        }
                    });
                    let cols = transpose_8x8(v3, r);
                    for (i, col) in cols.into_iter().enumerate() {
                        let col: [f32; 8] = pulp::cast(col);
                        out[(cb + i) * qt_w + lb..][..8].copy_from_slice(&col);
                    }
                }
            }
        });
    }
    for l in 0..nq {
        let row = &src[(r0 + l) * ld..][..d];
        for (i, &x) in row.iter().enumerate() {
            out[i * qt_w + l] = x * scale;
        }
    }
}

/// The columns of the 8 x 8 block whose rows are `r`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn transpose_8x8(v3: pulp::x86::V3, r: [core::arch::x86_64::__m256; 8]) -> [core::arch::x86_64::__m256; 8] {
    let a = v3.avx;
    // Pairs of rows interleaved, then quads (columns c and c + 4 of rows 0-3 and 4-7 in s[c] and
    // s[c + 4]), then the 128-bit halves joined.
    let (t0, t1) = (a._mm256_unpacklo_ps(r[0], r[1]), a._mm256_unpackhi_ps(r[0], r[1]));
    let (t2, t3) = (a._mm256_unpacklo_ps(r[2], r[3]), a._mm256_unpackhi_ps(r[2], r[3]));
    let (t4, t5) = (a._mm256_unpacklo_ps(r[4], r[5]), a._mm256_unpackhi_ps(r[4], r[5]));
    let (t6, t7) = (a._mm256_unpacklo_ps(r[6], r[7]), a._mm256_unpackhi_ps(r[6], r[7]));
    let s = [
        a._mm256_shuffle_ps::<0x44>(t0, t2),
        a._mm256_shuffle_ps::<0xEE>(t0, t2),
        a._mm256_shuffle_ps::<0x44>(t1, t3),
        a._mm256_shuffle_ps::<0xEE>(t1, t3),
        a._mm256_shuffle_ps::<0x44>(t4, t6),
        a._mm256_shuffle_ps::<0xEE>(t4, t6),
        a._mm256_shuffle_ps::<0x44>(t5, t7),
        a._mm256_shuffle_ps::<0xEE>(t5, t7),
    ];
    std::array::from_fn(|c| {
        if c < 4 {
            a._mm256_permute2f128_ps::<0x20>(s[c], s[c + 4])
        } else {
            a._mm256_permute2f128_ps::<0x31>(s[c - 4], s[c])
        }
    })
}

/// The keys of the causal run that rows `r0..r0 + nq` see: (keys any of them sees, keys all of
/// them see), and each lane's last visible key in `limit`.
pub(super) fn causal_span(
    c: Causal,
    run_len: usize,
    r0: usize,
    nq: usize,
    qt_w: usize,
    limit: &mut Vec<f32>,
) -> (usize, usize) {
    limit.clear();
    limit.extend((0..qt_w).map(|l| (c.diag + (r0 + l.min(nq - 1)) * c.step) as f32));
    let any = (c.diag + (r0 + nq - 1) * c.step + 1).min(run_len);
    let all = (c.diag + r0 * c.step + 1).min(run_len);
    (any, all)
}

/// Sets the scores of keys `j0..j0 + n` that a lane does not see to -inf.
#[inline(always)]
pub(super) fn mask(st: &mut [f32], qt_w: usize, j0: usize, n: usize, limit: &[f32]) {
    for j in 0..n {
        let key = (j0 + j) as f32;
        for (s, &lim) in st[j * qt_w..(j + 1) * qt_w].iter_mut().zip(limit) {
            if key > lim {
                *s = f32::NEG_INFINITY;
            }
        }
    }
}

/// One chunk of the online softmax: new running max per lane, `st` turned into `exp(s - max)`,
/// the running sum rescaled and extended, and the factor the output rows must be rescaled by in
/// `alpha`.
#[inline(always)]
pub(super) fn online_softmax(st: &mut [f32], qt_w: usize, m: &mut [f32], l: &mut [f32], alpha: &mut [f32]) {
    let mut new_m = [f32::NEG_INFINITY; 64];
    let new_m = &mut new_m[..qt_w];
    new_m.copy_from_slice(m);
    for row in st.chunks_exact(qt_w) {
        for (a, &s) in new_m.iter_mut().zip(row) {
            *a = a.max(s);
        }
    }
    // A lane that has seen no key yet keeps max -inf; subtracting 0 instead keeps exp(-inf) = 0.
    for x in new_m.iter_mut() {
        if *x == f32::NEG_INFINITY {
            *x = 0.0;
        }
    }
    let mut sum = [0f32; 64];
    let sum = &mut sum[..qt_w];
    for row in st.chunks_exact_mut(qt_w) {
        for ((s, &mx), acc) in row.iter_mut().zip(new_m.iter()).zip(sum.iter_mut()) {
            *s = exp_f32(*s - mx);
            *acc += *s;
        }
    }
    for i in 0..qt_w {
        alpha[i] = exp_f32(m[i] - new_m[i]);
        l[i] = l[i] * alpha[i] + sum[i];
        m[i] = new_m[i];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_transposed_in_blocks_equal_the_plain_transpose() {
        let (ld, r0) = (300, 3);
        let src: Vec<f32> = (0..ld * 80).map(|i| (i as f32 * 0.37).sin()).collect();
        for d in [8, 16, 32, 64, 128] {
            for qt_w in [16, 32] {
                for nq in 1..=qt_w {
                    let mut tile = Vec::new();
                    load_tile(&src, ld, d, r0, nq, qt_w, 0.125, &mut tile);
                    let plain: Vec<f32> = (0..d * qt_w)
                        .map(|at| {
                            let (i, l) = (at / qt_w, at % qt_w);
                            if l < nq { src[(r0 + l) * ld + i] * 0.125 } else { 0.0 }
                        })
                        .collect();
                    assert_eq!(tile, plain, "d {d}, qt_w {qt_w}, nq {nq}");
                }
            }
        }
    }
}
