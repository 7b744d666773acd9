//! RMSNorm and the q/k head norm fused with rotary embeddings, as differentiable candle ops.

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Shape, Tensor, WithDType};

use super::access::{CpuKernel, cpu_dispatch, on_cpu, op_error, slice, tensor};
use super::rope::Rope;
use crate::cpu::norm::{
    RopeTables, head_norm_rope_backward, head_norm_rope_forward, rms_norm_backward, rms_norm_forward, rope_rotate,
};
use crate::float::Real;

struct RmsNorm {
    eps: f64,
}

const RMS: &str = "rms_norm";

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        RMS
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        cpu_dispatch!(RMS, s1, |T| {
            let (x, w) = (slice::<T>(RMS, s1, l1)?, slice::<T>(RMS, s2, l2)?);
            if w.is_empty() || !x.len().is_multiple_of(w.len()) {
                return Err(op_error(RMS, "the weight must match the last dimension"));
            }
            Ok((T::to_cpu_storage_owned(rms_norm_forward(x, w, self.eps)), l1.shape().clone()))
        })
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        struct K<'a> {
            eps: f64,
            x: &'a Tensor,
            w: &'a Tensor,
        }
        impl CpuKernel for K<'_> {
            type Out = (Tensor, Tensor);
            fn run<T: Real + WithDType>(self, xs: &[&[T]]) -> candle_core::Result<Self::Out> {
                let (dx, dw) = rms_norm_backward(xs[0], xs[1], xs[2], self.eps);
                Ok((tensor(dx, self.x.shape())?, tensor(dw, self.w.shape())?))
            }
        }
        let dy = dy.contiguous()?;
        let (dx, dw) = on_cpu(RMS, &[x, w, &dy], K { eps: self.eps, x, w })?;
        Ok((Some(dx), Some(dw)))
    }
}

/// RMSNorm over the last dimension of `x` with weight `w`; differentiable in both.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> candle_core::Result<Tensor> {
    if !super::runs_fused(x) {
        return super::composed::rms_norm(x, w, eps);
    }
    x.contiguous()?.apply_op2(&w.contiguous()?, RmsNorm { eps })
}

struct HeadNormRope {
    eps: f64,
    positions: Arc<[u32]>,
    rope: Rope,
}

const HNR: &str = "head_norm_rope";

impl HeadNormRope {
    fn check(&self, x_len: usize, d: usize, tables: usize) -> candle_core::Result<()> {
        let t = self.positions.len();
        if d == 0 || !d.is_multiple_of(2) || t == 0 || !x_len.is_multiple_of(t * d) {
            return Err(op_error(HNR, "x must be [tokens, heads * head_dim] with an even head_dim"));
        }
        if let Some(p) = self.positions.iter().find(|&&p| p as usize * (d / 2) >= tables) {
            return Err(op_error(HNR, format!("position {p} is beyond the rotary tables")));
        }
        Ok(())
    }
}

impl CustomOp2 for HeadNormRope {
    fn name(&self) -> &'static str {
        HNR
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        cpu_dispatch!(HNR, s1, |T| {
            let (x, w) = (slice::<T>(HNR, s1, l1)?, slice::<T>(HNR, s2, l2)?);
            self.rope.with_cpu_tables::<T, _>(|tables| {
                self.check(x.len(), w.len(), tables.cos.len())?;
                let y = head_norm_rope_forward(x, w, self.eps, &self.positions, tables);
                Ok((T::to_cpu_storage_owned(y), l1.shape().clone()))
            })
        })
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        struct K<'a> {
            op: &'a HeadNormRope,
            x: &'a Tensor,
            w: &'a Tensor,
        }
        impl CpuKernel for K<'_> {
            type Out = (Tensor, Tensor);
            fn run<T: Real + WithDType>(self, xs: &[&[T]]) -> candle_core::Result<Self::Out> {
                let tables = RopeTables { cos: xs[3], sin: xs[4] };
                let (dx, dw) = head_norm_rope_backward(xs[0], xs[1], self.op.eps, &self.op.positions, tables, xs[2]);
                Ok((tensor(dx, self.x.shape())?, tensor(dw, self.w.shape())?))
            }
        }
        let dy = dy.contiguous()?;
        let (cos, sin) = (&self.rope.cos, &self.rope.sin);
        let (dx, dw) = on_cpu(HNR, &[x, w, &dy, cos, sin], K { op: self, x, w })?;
        Ok((Some(dx), Some(dw)))
    }
}

/// Per-head RMSNorm (weight `w [head_dim]`) then rotary embedding of `x [tokens, heads * head_dim]`
/// at `positions` (one per token); differentiable in `x` and `w`.
pub fn head_norm_rope(
    x: &Tensor,
    w: &Tensor,
    eps: f64,
    positions: Arc<[u32]>,
    rope: &Rope,
) -> candle_core::Result<Tensor> {
    if !super::runs_fused(x) {
        let d = w.elem_count();
        let op = HeadNormRope { eps, positions: positions.clone(), rope: rope.clone() };
        op.check(x.elem_count(), d, rope.max_positions() * (d / 2))?;
        return super::composed::head_norm_rope(x, w, eps, &positions, rope);
    }
    x.contiguous()?.apply_op2(&w.contiguous()?, HeadNormRope { eps, positions, rope: rope.clone() })
}

struct RopeOnly {
    head_dim: usize,
    positions: Arc<[u32]>,
    rope: Rope,
}

const ROPE: &str = "rope";

impl RopeOnly {
    fn check(&self, x_len: usize, tables: usize) -> candle_core::Result<()> {
        let (t, d) = (self.positions.len(), self.head_dim);
        if d == 0 || !d.is_multiple_of(2) || t == 0 || !x_len.is_multiple_of(t * d) {
            return Err(op_error(ROPE, "x must be [tokens, heads * head_dim] with an even head_dim"));
        }
        if d / 2 * self.rope.max_positions() != tables {
            return Err(op_error(ROPE, format!("the rotary tables are not for head_dim {d}")));
        }
        if let Some(p) = self.positions.iter().find(|&&p| p as usize * (d / 2) >= tables) {
            return Err(op_error(ROPE, format!("position {p} is beyond the rotary tables")));
        }
        Ok(())
    }
}

impl CustomOp1 for RopeOnly {
    fn name(&self) -> &'static str {
        ROPE
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        cpu_dispatch!(ROPE, s1, |T| {
            let x = slice::<T>(ROPE, s1, l1)?;
            self.rope.with_cpu_tables::<T, _>(|tables| {
                self.check(x.len(), tables.cos.len())?;
                let y = rope_rotate(x, self.head_dim, &self.positions, tables, false);
                Ok((T::to_cpu_storage_owned(y), l1.shape().clone()))
            })
        })
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, dy: &Tensor) -> candle_core::Result<Option<Tensor>> {
        struct K<'a> {
            op: &'a RopeOnly,
            x: &'a Tensor,
        }
        impl CpuKernel for K<'_> {
            type Out = Tensor;
            fn run<T: Real + WithDType>(self, xs: &[&[T]]) -> candle_core::Result<Self::Out> {
                let tables = RopeTables { cos: xs[1], sin: xs[2] };
                tensor(rope_rotate(xs[0], self.op.head_dim, &self.op.positions, tables, true), self.x.shape())
            }
        }
        let dy = dy.contiguous()?;
        let (cos, sin) = (&self.rope.cos, &self.rope.sin);
        Ok(Some(on_cpu(ROPE, &[&dy, cos, sin], K { op: self, x })?))
    }
}

/// Rotary embedding alone (the Llama / Qwen2 attention, which has no q/k norm) of
/// `x [tokens, heads * head_dim]` at `positions` (one per token); differentiable in `x`.
pub fn rope(x: &Tensor, head_dim: usize, positions: Arc<[u32]>, rope: &Rope) -> candle_core::Result<Tensor> {
    let op = RopeOnly { head_dim, positions, rope: rope.clone() };
    op.check(x.elem_count(), rope.max_positions() * (head_dim / 2))?;
    if !super::runs_fused(x) {
        return super::composed::rope(x, head_dim, &op.positions, rope);
    }
    x.contiguous()?.apply_op1(op)
}
