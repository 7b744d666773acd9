//! Causal grouped-query attention over a packed (possibly prefix-shared) row as one differentiable
//! candle op. The forward keeps the log-sum-exp per (token, head) for its backward, which
//! recomputes the probabilities block by block (no `T x T` tensor is ever stored).

use std::sync::{Arc, Mutex};

use candle_core::{CpuStorage, CustomOp3, Layout, Shape, Tensor, WithDType};

use super::access::{CpuKernel, cpu_dispatch, on_cpu, op_error, slice, tensor};
use crate::cpu::attention::{AttnShape, Qkv, backward, forward};
use crate::float::Real;
use crate::layout::RowLayout;

const ATTN: &str = "attention";

struct Attention {
    layout: Arc<RowLayout>,
    shape: AttnShape,
    scale: f64,
    /// The forward's log-sum-exp `[T, q_heads]`, kept for the backward.
    lse: Mutex<Option<Tensor>>,
}

impl Attention {
    fn check(&self, q: usize, k: usize, v: usize) -> candle_core::Result<()> {
        let s = self.shape;
        let t = self.layout.len();
        if s.kv_heads == 0 || !s.q_heads.is_multiple_of(s.kv_heads) {
            return Err(op_error(ATTN, "q_heads must be a multiple of kv_heads"));
        }
        if q != t * s.q_heads * s.head_dim || k != t * s.kv_heads * s.head_dim || v != k {
            return Err(op_error(ATTN, format!("q, k, v must be [{t}, heads * {}] for the row's layout", s.head_dim)));
        }
        Ok(())
    }
}

impl CustomOp3 for Attention {
    fn name(&self) -> &'static str {
        ATTN
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        cpu_dispatch!(ATTN, s1, |T| {
            let (q, k, v) = (slice::<T>(ATTN, s1, l1)?, slice::<T>(ATTN, s2, l2)?, slice::<T>(ATTN, s3, l3)?);
            self.check(q.len(), k.len(), v.len())?;
            let (o, lse) = forward(&self.layout, self.shape, Qkv::separate(q, k, v, self.shape), T::of(self.scale));
            let lse = tensor(lse, (self.layout.len(), self.shape.q_heads))?;
            *self.lse.lock().map_err(|_| op_error(ATTN, "lock poisoned"))? = Some(lse);
            Ok((T::to_cpu_storage_owned(o), l1.shape().clone()))
        })
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        res: &Tensor,
        d_o: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        struct K<'a> {
            op: &'a Attention,
            q: &'a Tensor,
            k: &'a Tensor,
        }
        impl CpuKernel for K<'_> {
            type Out = (Tensor, Tensor, Tensor);
            fn run<T: Real + WithDType>(self, xs: &[&[T]]) -> candle_core::Result<Self::Out> {
                let (l, s) = (&self.op.layout, self.op.shape);
                let qkv = Qkv::separate(xs[0], xs[1], xs[2], s);
                let (dq, dk, dv) = backward(l, s, qkv, xs[3], xs[4], xs[5], T::of(self.op.scale));
                Ok((tensor(dq, self.q.shape())?, tensor(dk, self.k.shape())?, tensor(dv, self.k.shape())?))
            }
        }
        let lse = self
            .lse
            .lock()
            .map_err(|_| op_error(ATTN, "lock poisoned"))?
            .clone()
            .ok_or_else(|| op_error(ATTN, "backward before forward"))?;
        let d_o = d_o.contiguous()?;
        let (dq, dk, dv) = on_cpu(ATTN, &[q, k, v, res, &lse, &d_o], K { op: self, q, k })?;
        Ok((Some(dq), Some(dk), Some(dv)))
    }
}

/// Attention of `q [T, Hq*d]` over `k`, `v [T, Hk*d]` (token-major, as projected) for a row laid
/// out as `layout`, scaled by `scale`; returns `[T, Hq*d]`. Differentiable in q, k and v.
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    layout: Arc<RowLayout>,
    shape: AttnShape,
    scale: f64,
) -> candle_core::Result<Tensor> {
    if !super::runs_fused(q) {
        return super::composed::attention(q, k, v, &layout, shape, scale);
    }
    let op = Attention { layout, shape, scale, lse: Mutex::new(None) };
    q.contiguous()?.apply_op3(&k.contiguous()?, &v.contiguous()?, op)
}
