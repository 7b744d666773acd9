//! Vectorised reductions, and `exp_f32` shown here from `float.rs` (where it is f32's
//! `Real::exp`). `vectorized` runs a loop under the best instruction set the CPU has (AVX2 + FMA
//! where present, chosen at run time by `pulp`), so the portable binary still gets wide SIMD.

use crate::float::Real;
pub use crate::float::exp_f32;

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
