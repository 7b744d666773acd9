//! Activation recomputation for the composed ops (CUDA, half precision): a candle op that runs a
//! composed function without keeping any of its intermediate tensors and recomputes them in its
//! backward. Through candle's autograd alone a composed layer keeps every intermediate until the
//! backward (at 4k tokens the 0.6B model's attention scores alone exceed an H200's 141 GB); with
//! this, a layer keeps its inputs and its output, and attention's backward recomputes one query
//! block at a time.

use candle_core::backprop::GradStore;
use candle_core::op::BackpropOp;
use candle_core::{CpuStorage, CudaStorage, CustomOp2, CustomOp3, DType, Layout, Shape, Storage, Tensor, Var};

use super::access::op_error;

/// A function whose intermediates are recomputed in the backward rather than kept.
pub(crate) trait Recomputed: Send + Sync {
    /// The op's name in errors.
    fn name(&self) -> &'static str;

    /// The function of the inputs (tracked or not: the caller decides).
    fn eval(&self, xs: &[Tensor]) -> candle_core::Result<Tensor>;

    /// Gradients of the inputs that want one (`track_op`), given the output's gradient `dy`. By
    /// default one recomputation of the whole function with the inputs as variables.
    fn grads(&self, xs: &[&Tensor], dy: &Tensor) -> candle_core::Result<Vec<Option<Tensor>>> {
        let vars = variables(xs)?;
        let inputs = tensors(xs, &vars);
        let out = self.eval(&inputs)?;
        let store = (out * dy.detach())?.sum_all()?.backward()?;
        collect(&vars, &store)
    }
}

/// A variable copy of each input that wants a gradient.
pub(crate) fn variables(xs: &[&Tensor]) -> candle_core::Result<Vec<Option<Var>>> {
    xs.iter().map(|x| if x.track_op() { Var::from_tensor(&x.detach()).map(Some) } else { Ok(None) }).collect()
}

/// The inputs for a recomputation: the variables, and the others detached.
pub(crate) fn tensors(xs: &[&Tensor], vars: &[Option<Var>]) -> Vec<Tensor> {
    xs.iter().zip(vars).map(|(x, v)| v.as_ref().map_or_else(|| x.detach(), |v| v.as_tensor().clone())).collect()
}

/// Each variable's gradient.
pub(crate) fn collect(vars: &[Option<Var>], store: &GradStore) -> candle_core::Result<Vec<Option<Tensor>>> {
    vars.iter().map(|v| v.as_ref().map(|v| grad_of(v, store)).transpose()).collect()
}

/// `v`'s gradient in `store` (zeros where the function did not use it).
pub(crate) fn grad_of(v: &Var, store: &GradStore) -> candle_core::Result<Tensor> {
    match store.get(v.as_tensor()) {
        Some(g) => Ok(g.clone()),
        None => v.as_tensor().zeros_like(),
    }
}

/// Applies `r` to `xs` (2 or 3 inputs) as one differentiable op when any input wants a gradient,
/// else evaluates it directly.
pub(crate) fn apply<R: Recomputed + 'static>(r: R, xs: &[&Tensor]) -> candle_core::Result<Tensor> {
    if !xs.iter().any(|x| x.track_op()) {
        let owned: Vec<Tensor> = xs.iter().map(|x| (*x).clone()).collect();
        return r.eval(&owned);
    }
    let op = Op(r);
    match xs {
        [a, b] => a.contiguous()?.apply_op2(&b.contiguous()?, op),
        [a, b, c] => a.contiguous()?.apply_op3(&b.contiguous()?, &c.contiguous()?, op),
        _ => Err(op_error(op.0.name(), format!("takes 2 or 3 inputs, got {}", xs.len()))),
    }
}

struct Op<R>(R);

impl<R: Recomputed> Op<R> {
    /// The function of the op's input storages, untracked, as a storage of the output.
    fn forward(&self, inputs: Vec<(Storage, &Layout)>) -> candle_core::Result<(Storage, Shape)> {
        let xs = inputs.into_iter().map(|(s, l)| wrap(self.0.name(), s, l)).collect::<candle_core::Result<Vec<_>>>()?;
        let out = self.0.eval(&xs)?;
        drop(xs);
        let n = out.elem_count();
        // A storage of exactly the output, from offset 0 (an op's fresh output already is one).
        let out = if out.layout().contiguous_offsets() == Some((0, n)) { out } else { out.affine(1.0, 0.0)? };
        let shape = out.shape().clone();
        let (storage, layout) = out.storage_and_layout();
        Ok((storage.try_clone(layout)?, shape))
    }

    fn grads(&self, xs: &[&Tensor], dy: &Tensor) -> candle_core::Result<Vec<Option<Tensor>>> {
        let grads = self.0.grads(xs, dy)?;
        // Gradients come back in each input's dtype (the recomputation may accumulate in f32).
        grads
            .into_iter()
            .zip(xs)
            .map(|(g, x)| g.map(|g| if g.dtype() == x.dtype() { Ok(g) } else { g.to_dtype(x.dtype()) }).transpose())
            .collect()
    }
}

/// The tensor a storage (cloned) holds under a contiguous layout.
fn wrap(name: &str, storage: Storage, l: &Layout) -> candle_core::Result<Tensor> {
    let (start, end) = l.contiguous_offsets().ok_or_else(|| op_error(name, "inputs must be contiguous"))?;
    Tensor::from_storage(storage, end, BackpropOp::none(), false).narrow(0, start, end - start)?.reshape(l.shape())
}

fn cpu(s: &CpuStorage, l: &Layout) -> candle_core::Result<Storage> {
    Ok(Storage::Cpu(candle_core::backend::BackendStorage::try_clone(s, l)?))
}

fn cuda(s: &CudaStorage, l: &Layout) -> candle_core::Result<Storage> {
    Ok(Storage::Cuda(candle_core::backend::BackendStorage::try_clone(s, l)?))
}

fn into_cpu(name: &str, (s, shape): (Storage, Shape)) -> candle_core::Result<(CpuStorage, Shape)> {
    match s {
        Storage::Cpu(s) => Ok((s, shape)),
        _ => Err(op_error(name, "the output left the CPU")),
    }
}

fn into_cuda(name: &str, (s, shape): (Storage, Shape)) -> candle_core::Result<(CudaStorage, Shape)> {
    match s {
        Storage::Cuda(s) => Ok((s, shape)),
        _ => Err(op_error(name, "the output left the GPU")),
    }
}

impl<R: Recomputed> CustomOp2 for Op<R> {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        into_cpu(self.0.name(), self.forward(vec![(cpu(s1, l1)?, l1), (cpu(s2, l2)?, l2)])?)
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        into_cuda(self.0.name(), self.forward(vec![(cuda(s1, l1)?, l1), (cuda(s2, l2)?, l2)])?)
    }

    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let mut g = self.grads(&[a, b], dy)?.into_iter();
        Ok((g.next().flatten(), g.next().flatten()))
    }
}

impl<R: Recomputed> CustomOp3 for Op<R> {
    fn name(&self) -> &'static str {
        self.0.name()
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
        into_cpu(self.0.name(), self.forward(vec![(cpu(s1, l1)?, l1), (cpu(s2, l2)?, l2), (cpu(s3, l3)?, l3)])?)
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
        s3: &CudaStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        into_cuda(self.0.name(), self.forward(vec![(cuda(s1, l1)?, l1), (cuda(s2, l2)?, l2), (cuda(s3, l3)?, l3)])?)
    }

    #[allow(clippy::type_complexity)]
    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        c: &Tensor,
        _res: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let mut g = self.grads(&[a, b, c], dy)?.into_iter();
        Ok((g.next().flatten(), g.next().flatten(), g.next().flatten()))
    }
}

/// Adds `g` into the accumulator `acc` (f32 at least, so half-precision sums do not round).
pub(crate) fn accumulate(acc: &mut Option<Tensor>, g: Option<Tensor>) -> candle_core::Result<()> {
    if let Some(g) = g {
        let g = if g.dtype() == DType::F64 { g } else { g.to_dtype(DType::F32)? };
        *acc = Some(match acc.take() {
            Some(a) => (a + g)?,
            None => g,
        });
    }
    Ok(())
}
