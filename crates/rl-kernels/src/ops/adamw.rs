//! AdamW as two in-place candle ops on a parameter and its `[2, n]` moments (`[m; v]`), so one
//! update is two passes over memory instead of a dozen allocating tensor ops.

use candle_core::{CpuStorage, InplaceOp2, Layout, Tensor};

use super::access::{op_error, slice};
use crate::cpu::adamw::{AdamW, apply_update, moments_update};

const MOMENTS: &str = "adamw_moments";
const APPLY: &str = "adamw_apply";

/// The contiguous part of `data` a layout describes.
fn contiguous_mut<'a, T>(op: &str, data: &'a mut [T], l: &Layout) -> candle_core::Result<&'a mut [T]> {
    let (a, b) = l.contiguous_offsets().ok_or_else(|| op_error(op, "must be contiguous"))?;
    Ok(&mut data[a..b])
}

struct Moments(AdamW);

impl InplaceOp2 for Moments {
    fn name(&self) -> &'static str {
        MOMENTS
    }

    fn cpu_fwd(&self, s1: &mut CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> candle_core::Result<()> {
        match s1 {
            CpuStorage::F32(m) => moments_update(contiguous_mut(MOMENTS, m, l1)?, slice(MOMENTS, s2, l2)?, &self.0),
            CpuStorage::F64(m) => moments_update(contiguous_mut(MOMENTS, m, l1)?, slice(MOMENTS, s2, l2)?, &self.0),
            _ => return Err(op_error(MOMENTS, "only f32 and f64 are supported")),
        }
        Ok(())
    }
}

struct Apply(AdamW);

impl InplaceOp2 for Apply {
    fn name(&self) -> &'static str {
        APPLY
    }

    fn cpu_fwd(&self, s1: &mut CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> candle_core::Result<()> {
        match s1 {
            CpuStorage::F32(w) => apply_update(contiguous_mut(APPLY, w, l1)?, slice(APPLY, s2, l2)?, &self.0),
            CpuStorage::F64(w) => apply_update(contiguous_mut(APPLY, w, l1)?, slice(APPLY, s2, l2)?, &self.0),
            _ => return Err(op_error(APPLY, "only f32 and f64 are supported")),
        }
        Ok(())
    }
}

/// The sum of squares of a tensor's elements, accumulated in f64 (for global-norm clipping).
pub fn sum_squares(t: &Tensor) -> candle_core::Result<f64> {
    struct K;
    impl super::access::CpuKernel for K {
        type Out = f64;
        fn run<T: crate::float::Real + candle_core::WithDType>(self, xs: &[&[T]]) -> candle_core::Result<f64> {
            Ok(crate::cpu::adamw::sum_squares(xs[0]))
        }
    }
    if t.device().is_cpu() {
        let t = t.contiguous()?;
        return super::access::on_cpu("sum_squares", &[&t], K);
    }
    t.to_dtype(candle_core::DType::F64)?.sqr()?.sum_all()?.to_scalar()
}

/// One AdamW update of `weight` in place, with its moments `state` (`[2, numel]`: m then v, updated
/// in place) and gradient `grad` (scaled by `h.grad_scale`).
pub fn adamw_step(weight: &Tensor, state: &Tensor, grad: &Tensor, h: &AdamW) -> candle_core::Result<()> {
    let n = weight.elem_count();
    if grad.elem_count() != n || state.elem_count() != 2 * n {
        return Err(op_error(MOMENTS, "the gradient and moments must match the weight"));
    }
    if weight.dtype() != grad.dtype() || weight.dtype() != state.dtype() {
        return Err(op_error(MOMENTS, "the weight, gradient and moments must share one dtype"));
    }
    if !super::runs_fused(weight) {
        return super::composed::adamw_step(weight, state, grad, h);
    }
    let grad = grad.contiguous()?;
    state.inplace_op2(&grad, &Moments(*h))?;
    weight.inplace_op2(state, &Apply(*h))
}
