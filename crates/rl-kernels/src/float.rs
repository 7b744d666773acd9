//! The float types the kernels run on: f32 for real work, f64 for gradient checks. f32's `e^x`
//! (`exp_f32`) is a Cephes-style polynomial (about 1 ulp, exact 0 for inputs below -87.3, -inf
//! included) written as straight-line arithmetic so loops over slices vectorise.

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

// f32 uses the vectorisable polynomial (kernels run in f32); f64 (gradient checks) the exact one.
real!(f32, exp_f32);
real!(f64, f64::exp);
