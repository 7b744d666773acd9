//! Vectorised elementwise math and reductions. `exp_f32` is a Cephes-style polynomial (about 1 ulp, exact 0 for
//! inputs below -87.3, -inf included) written as straight-line arithmetic so loops over slices
//! vectorise; `vectorized` runs a loop under the best instruction set the CPU has (AVX2 + FMA
//! where present, chosen at run time by `pulp`), so the portable binary still gets wide SIMD.

use crate::float::Real;

/// `e^x` for f32, vectorisable.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Round to nearest by adding and subtracting 1.5 * 2^23 (no call to `floorf`).
    const ROUND: f32 = 12_582_912.0;
    // 2^23 + 127.
    const BIAS_MAGIC: f32 = 8_388_735.0;
    let xc = x.clamp(-87.0, 88.0);
    let n = (xc * LOG2E + ROUND) - ROUND;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    // 2^n without a float-to-int cast (whose saturating semantics compile to per-lane scalar
    // code): n + 127 is an integer in 1..=254, so adding 2^23 puts it in the low mantissa bits,
    // and shifting those into the exponent field gives 2^n.
    let scale = f32::from_bits((n + BIAS_MAGIC).to_bits() << 23);
    if x < -87.0 { 0.0 } else { y * scale }
}

/// Runs `f` compiled for the widest instruction set available at run time. Pass a closure marked
/// `#[inline(always)]` whose helpers are `#[inline(always)]` too: only code inlined into the
/// dispatched function is compiled with the wider instructions.
#[inline(always)]
pub fn vectorized<R>(f: impl FnOnce() -> R) -> R {
    pulp::Arch::new().dispatch(f)
}

/// Lanes of the reductions below (independent accumulators, so the loops vectorise without
/// reassociating a single sum).
const LANES: usize = 8;

/// The largest element (NEG_INFINITY for an empty slice).
#[inline(always)]
pub fn max_of<T: Real>(x: &[T]) -> T {
    let mut acc = [T::NEG_INFINITY; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for k in 0..LANES {
            acc[k] = acc[k].max(c[k]);
        }
    }
    rest.iter().chain(&acc).fold(T::NEG_INFINITY, |m, &v| m.max(v))
}

/// The sum of the elements.
#[inline(always)]
pub fn sum_of<T: Real>(x: &[T]) -> T {
    let mut acc = [T::ZERO; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for k in 0..LANES {
            acc[k] += c[k];
        }
    }
    rest.iter().chain(&acc).fold(T::ZERO, |s, &v| s + v)
}

/// The dot product of two equal-length slices.
#[inline(always)]
pub fn dot<T: Real>(a: &[T], b: &[T]) -> T {
    let mut acc = [T::ZERO; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for k in 0..LANES {
            acc[k] += x[k] * y[k];
        }
    }
    ra.iter().zip(rb).fold(acc.iter().fold(T::ZERO, |s, &v| s + v), |s, (&x, &y)| s + x * y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reductions_match_their_definitions() {
        let x: Vec<f64> = (0..29).map(|i| ((i * 7) % 11) as f64 - 4.5).collect();
        assert_eq!(max_of(&x), 5.5);
        assert!((sum_of(&x) - x.iter().sum::<f64>()).abs() < 1e-12);
        assert!((dot(&x, &x) - x.iter().map(|v| v * v).sum::<f64>()).abs() < 1e-9);
        assert_eq!(max_of::<f64>(&[]), f64::NEG_INFINITY);
    }

    #[test]
    fn exp_is_accurate_over_the_range_softmax_uses() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let (got, want) = (f64::from(exp_f32(x)), f64::from(x).exp());
            worst = worst.max((got - want).abs() / want);
            x += 0.0137;
        }
        assert!(worst < 4e-7, "worst relative error {worst}");
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-100.0), 0.0);
        assert_eq!(exp_f32(0.0), 1.0);
        assert!(exp_f32(f32::NAN).is_nan());
    }
}
