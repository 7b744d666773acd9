//! Vectorised reductions, and `exp_f32` shown here from `float.rs` (where it is f32's
//! `Real::exp`). `vectorized` runs a loop under the best instruction set the CPU has (AVX-512 or
//! AVX2 + FMA where present, chosen at run time by `pulp`, capped by `RL_SIMD`: [`arch`], which
//! every CPU kernel dispatches through), so the portable binary still gets wide SIMD.

use std::sync::OnceLock;

use crate::float::Real;
pub use crate::float::exp_f32;

/// The environment variable that caps the CPU kernels' instruction set: `avx2` runs their AVX2
/// code on a CPU that has AVX-512 too (CI tests both sets of tiles so on one machine; a user may
/// keep a CPU off its AVX-512 clocks); `native`, or unset, the widest the CPU has.
pub const SIMD_VAR: &str = "RL_SIMD";

/// An `RL_SIMD` value the kernels cannot honour.
#[derive(Debug, thiserror::Error)]
pub enum SimdError {
    #[error("{SIMD_VAR}={0:?}: expected `native` (the widest instruction set this CPU has) or `avx2`")]
    Unknown(String),
    #[error("{SIMD_VAR}=avx2: this CPU has no AVX2 with FMA")]
    NoAvx2,
}

/// Whether `RL_SIMD` holds a value the kernels can honour (`rl` checks it at start, so a typo is
/// an error rather than the widest instruction set in silence).
pub fn check_simd_var() -> Result<(), SimdError> {
    requested().map(|_| ())
}

fn requested() -> Result<pulp::Arch, SimdError> {
    parse(std::env::var(SIMD_VAR))
}

/// The instruction set an `RL_SIMD` value asks for.
fn parse(value: Result<String, std::env::VarError>) -> Result<pulp::Arch, SimdError> {
    match value {
        Err(std::env::VarError::NotPresent) => Ok(pulp::Arch::new()),
        Ok(v) if v.is_empty() || v == "native" => Ok(pulp::Arch::new()),
        Ok(v) if v == "avx2" => avx2(),
        Ok(v) => Err(SimdError::Unknown(v)),
        Err(std::env::VarError::NotUnicode(v)) => Err(SimdError::Unknown(v.to_string_lossy().into_owned())),
    }
}

#[cfg(target_arch = "x86_64")]
fn avx2() -> Result<pulp::Arch, SimdError> {
    pulp::x86::V3::try_new().map(pulp::Arch::V3).ok_or(SimdError::NoAvx2)
}

#[cfg(not(target_arch = "x86_64"))]
fn avx2() -> Result<pulp::Arch, SimdError> {
    Err(SimdError::NoAvx2)
}

/// The instruction set every CPU kernel dispatches to: the widest the CPU has, capped by
/// `RL_SIMD` (read once; a value [`check_simd_var`] refuses leaves the widest).
#[inline]
pub fn arch() -> pulp::Arch {
    static ARCH: OnceLock<pulp::Arch> = OnceLock::new();
    *ARCH.get_or_init(|| requested().unwrap_or_else(|_| pulp::Arch::new()))
}

/// Runs `f` compiled for the instruction set of [`arch`]. Pass a closure marked
/// `#[inline(always)]` whose helpers are `#[inline(always)]` too: only code inlined into the
/// dispatched function is compiled with the wider instructions.
#[inline(always)]
pub fn vectorized<R>(f: impl FnOnce() -> R) -> R {
    arch().dispatch(f)
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
    fn rl_simd_values_are_parsed_or_refused() {
        let lanes = |a: pulp::Arch| {
            struct Lanes;
            impl pulp::WithSimd for Lanes {
                type Output = usize;
                #[inline(always)]
                fn with_simd<S: pulp::Simd>(self, _: S) -> usize {
                    S::F32_LANES
                }
            }
            a.dispatch(Lanes)
        };
        let native = lanes(pulp::Arch::new());
        for v in [Err(std::env::VarError::NotPresent), Ok(String::new()), Ok("native".into())] {
            assert_eq!(lanes(parse(v).unwrap()), native);
        }
        #[cfg(target_arch = "x86_64")]
        if pulp::x86::V3::try_new().is_some() {
            assert_eq!(lanes(parse(Ok("avx2".into())).unwrap()), 8);
        }
        let err = parse(Ok("avx512".into())).unwrap_err().to_string();
        assert!(err.contains("RL_SIMD=\"avx512\"") && err.contains("`avx2`"), "{err}");
    }

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
