//! A dense layer `y = x W^T` (HF weight layout `[out, in]`) as one candle op whose backward
//! writes `dW = dy^T x` straight in the weight's layout. Through candle's matmul of a transposed
//! view, the weight gradient would come back transposed and be added element by element through
//! strides; here both gradients are single multi-threaded products.

use candle_core::{CpuStorage, CustomOp2, Layout, Shape, Tensor, WithDType};

use super::access::{CpuKernel, cpu_dispatch, on_cpu, op_error, slice, tensor};
use crate::float::Real;
use crate::gemm::{MatRef, product_new};

const LINEAR: &str = "linear";

struct Linear;

/// (rows of x, in, out) for x `[.., in]` and w `[out, in]`.
fn dims(x: &Shape, w: &Shape) -> candle_core::Result<(usize, usize, usize)> {
    let (out, inp) = w.dims2().map_err(|_| op_error(LINEAR, "the weight must be [out, in]"))?;
    if x.dims().last() != Some(&inp) {
        return Err(op_error(LINEAR, format!("input {x:?} does not end in the weight's {inp} inputs")));
    }
    Ok((x.elem_count() / inp.max(1), inp, out))
}

fn forward<T: Real>(x: &[T], w: &[T], m: usize, inp: usize, out: usize) -> Vec<T> {
    product_new(MatRef::rows(x, m, inp, inp), MatRef::rows(w, out, inp, inp).t(), T::ONE, true)
}

impl CustomOp2 for Linear {
    fn name(&self) -> &'static str {
        LINEAR
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (m, inp, out) = dims(l1.shape(), l2.shape())?;
        let mut shape = l1.shape().dims().to_vec();
        *shape.last_mut().expect("checked above") = out;
        cpu_dispatch!(LINEAR, s1, |T| {
            let y = forward(slice::<T>(LINEAR, s1, l1)?, slice::<T>(LINEAR, s2, l2)?, m, inp, out);
            Ok((T::to_cpu_storage_owned(y), Shape::from(shape)))
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
            x: &'a Tensor,
            w: &'a Tensor,
            dims: (usize, usize, usize),
        }
        impl CpuKernel for K<'_> {
            type Out = (Tensor, Option<Tensor>);
            fn run<T: Real + WithDType>(self, xs: &[&[T]]) -> candle_core::Result<Self::Out> {
                let (m, inp, out) = self.dims;
                let (x, w, dy) = (xs[0], xs[1], xs[2]);
                let dx = product_new(MatRef::rows(dy, m, out, out), MatRef::rows(w, out, inp, inp), T::ONE, true);
                // A frozen weight (not a variable, e.g. a base model under adapters) needs no
                // gradient: its product is the largest of the output head's backward.
                let dw = self.w.track_op().then(|| {
                    product_new(MatRef::rows(dy, m, out, out).t(), MatRef::rows(x, m, inp, inp), T::ONE, true)
                });
                Ok((tensor(dx, self.x.shape())?, dw.map(|d| tensor(d, self.w.shape())).transpose()?))
            }
        }
        let dims = dims(x.shape(), w.shape())?;
        let dy = dy.contiguous()?;
        let (dx, dw) = on_cpu(LINEAR, &[x, w, &dy], K { x, w, dims })?;
        Ok((Some(dx), dw))
    }
}

/// `x W^T` for `x [.., in]` and an HF weight `W [out, in]`; differentiable in both. On CPU one
/// fused op; elsewhere candle's matmul.
pub fn linear(x: &Tensor, w: &Tensor) -> candle_core::Result<Tensor> {
    if super::runs_fused(x) { x.contiguous()?.apply_op2(&w.contiguous()?, Linear) } else { x.broadcast_matmul(&w.t()?) }
}
