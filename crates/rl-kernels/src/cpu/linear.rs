//! Dense layers on slices for the inference runtime: `y = x W^T` with HF-layout weights
//! (`W [out, in]`), on every thread when the product is large enough to pay for it.

use crate::float::Real;
use crate::gemm::{MatMut, MatRef, matmul, matmul_par};

/// Products below this many multiply-adds run on one thread (a thread hand-off costs more).
const PARALLEL_MIN_MACS: usize = 1 << 18;

/// `y [m, out] (+)= x [m, in] · W^T` for `w` holding `out` rows of `in` (row `r0..r0 + out` of a
/// larger stacked weight is `&w[r0 * in..]`).
pub fn linear<T: Real>(y: &mut [T], x: &[T], w: &[T], m: usize, inp: usize, out: usize, accumulate: bool) {
    let dst = MatMut::rows(y, m, out, out);
    let (lhs, rhs) = (MatRef::rows(x, m, inp, inp), MatRef::rows(w, out, inp, inp).t());
    if m * inp * out >= PARALLEL_MIN_MACS {
        matmul_par(dst, lhs, rhs, T::ONE, accumulate);
    } else {
        matmul(dst, lhs, rhs, T::ONE, accumulate);
    }
}
