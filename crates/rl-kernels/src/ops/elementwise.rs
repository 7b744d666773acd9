//! SwiGLU's gate (`silu(g) * u`) as one differentiable candle op.

use candle_core::{CpuStorage, CustomOp2, Layout, Shape, Tensor, WithDType};

use super::access::{CpuKernel, cpu_dispatch, on_cpu, op_error, slice, tensor};
use crate::cpu::swiglu::{swiglu_backward, swiglu_forward};
use crate::float::Real;

const SWIGLU: &str = "swiglu";

struct SwiGlu;

impl CustomOp2 for SwiGlu {
    fn name(&self) -> &'static str {
        SWIGLU
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        if l1.shape() != l2.shape() {
            return Err(op_error(SWIGLU, "gate and up must have one shape"));
        }
        cpu_dispatch!(SWIGLU, s1, |T| {
            let y = swiglu_forward(slice::<T>(SWIGLU, s1, l1)?, slice::<T>(SWIGLU, s2, l2)?);
            Ok((T::to_cpu_storage_owned(y), l1.shape().clone()))
        })
    }

    fn bwd(
        &self,
        g: &Tensor,
        u: &Tensor,
        _res: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        struct K<'a>(&'a Tensor);
        impl CpuKernel for K<'_> {
            type Out = (Tensor, Tensor);
            fn run<T: Real + WithDType>(self, xs: &[&[T]]) -> candle_core::Result<Self::Out> {
                let (dg, du) = swiglu_backward(xs[0], xs[1], xs[2]);
                Ok((tensor(dg, self.0.shape())?, tensor(du, self.0.shape())?))
            }
        }
        let dy = dy.contiguous()?;
        let (dg, du) = on_cpu(SWIGLU, &[g, u, &dy], K(g))?;
        Ok((Some(dg), Some(du)))
    }
}

/// `silu(gate) * up`; differentiable in both.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> candle_core::Result<Tensor> {
    if !super::runs_fused(gate) {
        return super::composed::swiglu(gate, up);
    }
    gate.contiguous()?.apply_op2(&up.contiguous()?, SwiGlu)
}
