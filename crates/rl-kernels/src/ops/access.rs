//! Reading tensors' CPU data without copies, for the custom ops: every op runs its kernel on the
//! contiguous f32 (or, in gradient checks, f64) slices of its inputs and wraps the result.

use candle_core::{CpuStorage, DType, Device, Layout, Shape, Storage, Tensor, WithDType};

use crate::float::Real;

/// An error of a custom op, in candle's error type.
pub(crate) fn op_error(op: &str, msg: impl std::fmt::Display) -> candle_core::Error {
    candle_core::Error::Msg(format!("{op}: {msg}"))
}

/// The contiguous data of a CPU storage as a slice of `T`.
pub(crate) fn slice<'a, T: WithDType>(op: &str, s: &'a CpuStorage, l: &Layout) -> candle_core::Result<&'a [T]> {
    let data = s.as_slice::<T>()?;
    let (a, b) = l.contiguous_offsets().ok_or_else(|| op_error(op, "inputs must be contiguous"))?;
    Ok(&data[a..b])
}

/// A float kernel over the data of several tensors.
pub(crate) trait CpuKernel {
    /// What it returns.
    type Out;
    /// Runs on the inputs' slices, all of dtype `T`.
    fn run<T: Real + WithDType>(self, xs: &[&[T]]) -> candle_core::Result<Self::Out>;
}

/// Runs `k` on the contiguous CPU data of `ts`, which must share one float dtype (f32 or f64).
pub(crate) fn on_cpu<K: CpuKernel>(op: &str, ts: &[&Tensor], k: K) -> candle_core::Result<K::Out> {
    let dtype = ts.first().map_or(DType::F32, |t| t.dtype());
    if ts.iter().any(|t| t.dtype() != dtype) {
        return Err(op_error(op, "inputs must share one dtype"));
    }
    let guards: Vec<_> = ts.iter().map(|t| t.storage_and_layout()).collect();
    macro_rules! run {
        ($t:ty) => {{
            let mut xs: Vec<&[$t]> = Vec::with_capacity(ts.len());
            for (s, l) in &guards {
                match &**s {
                    Storage::Cpu(c) => xs.push(slice::<$t>(op, c, l)?),
                    _ => return Err(op_error(op, "this backward runs on CPU tensors only")),
                }
            }
            k.run::<$t>(&xs)
        }};
    }
    match dtype {
        DType::F32 => run!(f32),
        DType::F64 => run!(f64),
        other => Err(op_error(op, format!("dtype {other:?} is not supported (f32 or f64)"))),
    }
}

/// A CPU tensor from a kernel's output.
pub(crate) fn tensor<T: WithDType>(data: Vec<T>, shape: impl Into<Shape>) -> candle_core::Result<Tensor> {
    Tensor::from_vec(data, shape, &Device::Cpu)
}

/// Dispatches a storage's float dtype to a generic kernel call returning a storage.
macro_rules! cpu_dispatch {
    ($op:expr, $storage:expr, |$t:ident| $body:expr) => {
        match $storage {
            candle_core::CpuStorage::F32(_) => {
                type $t = f32;
                $body
            }
            candle_core::CpuStorage::F64(_) => {
                type $t = f64;
                $body
            }
            _ => Err($crate::ops::access::op_error($op, "only f32 and f64 are supported")),
        }
    };
}
pub(crate) use cpu_dispatch;
