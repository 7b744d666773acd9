//! The float types the kernels run on: f32 for real work, f64 for gradient checks.

use std::fmt::Debug;
use std::ops::{Add, AddAssign, Div, Mul, MulAssign, Neg, Sub, SubAssign};

/// f32 or f64.
pub trait Real:
    Copy
    + Debug
    + Default
    + PartialOrd
    + Send
    + Sync
    + 'static
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
{
    /// 0.
    const ZERO: Self;
    /// 1.
    const ONE: Self;
    /// Negative infinity.
    const NEG_INFINITY: Self;
    /// From an f64 (rounded for f32).
    fn of(x: f64) -> Self;
    /// To f64.
    fn f64(self) -> f64;
    /// e^x.
    fn exp(self) -> Self;
    /// Natural logarithm.
    fn ln(self) -> Self;
    /// Square root.
    fn sqrt(self) -> Self;
    /// The larger of two (NaN-ignoring, as `f32::max`).
    fn max(self, other: Self) -> Self;
    /// Finite (not NaN or infinite).
    fn is_finite(self) -> bool;
    /// The slice as f32 when this type is f32 (the way into the f32-only kernels).
    fn as_f32(x: &[Self]) -> Option<&[f32]>;
    /// The same, mutable.
    fn as_f32_mut(x: &mut [Self]) -> Option<&mut [f32]>;
}

macro_rules! real {
    (@view f32, $x:ident) => {
        Some($x)
    };
    (@view f64, $x:ident) => {{
        let _ = $x;
        None
    }};
    ($t:ident, $exp:expr) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const NEG_INFINITY: Self = <$t>::NEG_INFINITY;
            #[inline]
            fn of(x: f64) -> Self {
                x as $t
            }
            #[inline]
            fn f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn exp(self) -> Self {
                $exp(self)
            }
            #[inline]
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            #[inline]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline]
            fn max(self, other: Self) -> Self {
                <$t>::max(self, other)
            }
            #[inline]
            fn is_finite(self) -> bool {
                <$t>::is_finite(self)
            }
            #[inline]
            fn as_f32(x: &[Self]) -> Option<&[f32]> {
                real!(@view $t, x)
            }
            #[inline]
            fn as_f32_mut(x: &mut [Self]) -> Option<&mut [f32]> {
                real!(@view $t, x)
            }
        }
    };
}

// f32 uses the vectorisable polynomial (kernels run in f32); f64 (gradient checks) the exact one.
real!(f32, crate::cpu::simd::exp_f32);
real!(f64, f64::exp);
