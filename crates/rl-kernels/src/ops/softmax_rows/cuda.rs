//! Launches the CUDA kernels of `kernels.cu` as candle ops (the GPU side of `softmax_rows`): kernel
//! launches and their output allocations are FFI, so this file is on tidy's list of `unsafe` ones.
#![allow(unsafe_code)]

use std::sync::OnceLock;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits};
use candle_core::cuda_backend::{Map2, WrapErr, kernel_name};
use candle_core::{CpuStorage, CudaDevice, CudaStorage, CustomOp2, DType, Layout, Shape, Tensor, WithDType};

use crate::ops::access::op_error;

const OP: &str = "attention softmax";
const MODULE: &str = "rl_softmax_rows";
const SOURCE: &str = include_str!("kernels.cu");
/// The kernels' thread-block size (`THREADS` in the source).
const THREADS: u32 = 256;

/// Whether the kernels take `t`: a CUDA tensor of f32 or bf16.
pub(crate) fn takes(t: &Tensor) -> bool {
    t.device().is_cuda() && matches!(t.dtype(), DType::F32 | DType::BF16)
}

/// The kernels' PTX, compiled on first use.
fn ptx() -> candle_core::Result<&'static str> {
    static PTX: OnceLock<Result<String, String>> = OnceLock::new();
    PTX.get_or_init(|| {
        candle_core::cuda_backend::cudarc::nvrtc::compile_ptx(SOURCE).map(|p| p.to_src()).map_err(|e| e.to_string())
    })
    .as_deref()
    .map_err(|e| op_error(OP, format!("NVRTC cannot compile softmax_rows/kernels.cu: {e}")))
}

/// Which kernel, and the arguments beyond the two inputs and the output.
#[derive(Clone, Copy)]
enum Kernel {
    MaskedSoftmax { rows: u32, keys: u32, scale: f32 },
    SoftmaxGrad { keys: u32, scale: f32 },
}

impl Kernel {
    fn keys(self) -> u32 {
        match self {
            Kernel::MaskedSoftmax { keys, .. } | Kernel::SoftmaxGrad { keys, .. } => keys,
        }
    }
}

impl Map2 for Kernel {
    fn f<T: DeviceRepr + WithDType + ValidAsZeroBits>(
        &self,
        a: &CudaSlice<T>,
        la: &Layout,
        b: &CudaSlice<T>,
        lb: &Layout,
        dev: &CudaDevice,
    ) -> candle_core::Result<CudaSlice<T>> {
        let ((a0, a1), (b0, b1)) = match (la.contiguous_offsets(), lb.contiguous_offsets()) {
            (Some(x), Some(y)) => (x, y),
            _ => return Err(op_error(OP, "inputs must be contiguous")),
        };
        let n = a1 - a0;
        let keys = self.keys() as usize;
        if keys == 0 || !n.is_multiple_of(keys) {
            return Err(op_error(OP, format!("{n} scores are not rows of {keys} keys")));
        }
        let root = match self {
            Kernel::MaskedSoftmax { .. } => "masked_softmax",
            Kernel::SoftmaxGrad { .. } => "softmax_grad",
        };
        let func = dev.get_or_load_custom_func(&kernel_name::<T>(root), MODULE, ptx()?)?;
        let (a, b) = (a.slice(a0..a1), b.slice(b0..b1));
        // SAFETY: every element is written by the kernel below.
        let out = unsafe { dev.alloc::<T>(n)? };
        let score_rows = u32::try_from(n / keys).map_err(|_| op_error(OP, "too many score rows"))?;
        let cfg = LaunchConfig { grid_dim: (score_rows, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        let mut builder = func.builder();
        builder.arg(&a);
        builder.arg(&b);
        builder.arg(&out);
        match *self {
            Kernel::MaskedSoftmax { rows, keys, scale } => {
                candle_core::builder_arg!(builder, rows, keys, scale);
                // SAFETY: the arguments match the kernel's signature; the grid covers the rows.
                unsafe { builder.launch(cfg) }.w()?;
            }
            Kernel::SoftmaxGrad { keys, scale } => {
                candle_core::builder_arg!(builder, keys, scale);
                // SAFETY: as above.
                unsafe { builder.launch(cfg) }.w()?;
            }
        }
        Ok(out)
    }
}

impl CustomOp2 for Kernel {
    fn name(&self) -> &'static str {
        "softmax-rows"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        Err(op_error(OP, "this kernel runs on CUDA only"))
    }

    fn cuda_fwd(
        &self,
        a: &CudaStorage,
        la: &Layout,
        b: &CudaStorage,
        lb: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let dev = a.device().clone();
        let slice = self.map(&a.slice, la, &b.slice, lb, &dev)?;
        Ok((CudaStorage { slice, device: dev }, la.shape().clone()))
    }
}

fn dims(mask: &Tensor) -> candle_core::Result<(u32, u32)> {
    let (rows, keys) = mask.dims2()?;
    let n = |x: usize| u32::try_from(x).map_err(|_| op_error(OP, "the mask is too large"));
    Ok((n(rows)?, n(keys)?))
}

pub(crate) fn masked_softmax(s: &Tensor, mask: &Tensor, scale: f64) -> candle_core::Result<Tensor> {
    let (rows, keys) = dims(mask)?;
    if s.dim(candle_core::D::Minus1)? != keys as usize || !s.elem_count().is_multiple_of(rows as usize * keys as usize)
    {
        return Err(op_error(OP, format!("scores {:?} do not repeat a mask of {rows} x {keys}", s.shape())));
    }
    let kernel = Kernel::MaskedSoftmax { rows, keys, scale: scale as f32 };
    s.contiguous()?.apply_op2_no_bwd(&mask.to_dtype(s.dtype())?.contiguous()?, &kernel)
}

pub(crate) fn softmax_grad(p: &Tensor, dp: &Tensor, scale: f64) -> candle_core::Result<Tensor> {
    if p.shape() != dp.shape() {
        return Err(op_error(OP, format!("probabilities {:?} and their gradient {:?}", p.shape(), dp.shape())));
    }
    let keys = u32::try_from(p.dim(candle_core::D::Minus1)?).map_err(|_| op_error(OP, "too many keys"))?;
    let kernel = Kernel::SoftmaxGrad { keys, scale: scale as f32 };
    p.contiguous()?.apply_op2_no_bwd(&dp.to_dtype(p.dtype())?.contiguous()?, &kernel)
}
