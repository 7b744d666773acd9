//! The one place a configured device and precision become candle's: CPU, or CUDA device 0 in a
//! build with the `cuda` feature (the trainer, SFT and the inference server all ask here).

use candle_core::{DType, Device};

use crate::error::{Error, Result};

/// The device of a config's `device`.
pub fn open_device(device: rl_configs::Device) -> Result<Device> {
    match device {
        rl_configs::Device::Cpu => Ok(Device::Cpu),
        rl_configs::Device::Cuda => cuda(),
    }
}

/// CUDA device 0, with cudarc's per-tensor events off (`rl_kernels::single_stream_cuda`) and
/// freed memory kept in its pool (`rl_kernels::keep_cuda_pool_memory`).
#[cfg(feature = "cuda")]
fn cuda() -> Result<Device> {
    let device = open_cuda()?;
    if let Device::Cuda(d) = &device {
        rl_kernels::single_stream_cuda(d);
        rl_kernels::keep_cuda_pool_memory(d);
    }
    Ok(device)
}

#[cfg(feature = "cuda")]
fn open_cuda() -> Result<Device> {
    Device::new_cuda(0).map_err(|e| {
        // The cause only: candle attaches a backtrace when RUST_BACKTRACE is set.
        let e = match e {
            candle_core::Error::WithBacktrace { inner, .. } => *inner,
            e => e,
        };
        Error::Device(format!(
            "device = \"cuda\": cannot open CUDA device 0 ({e}); this machine needs an NVIDIA GPU and its \
             driver (CUDA_ERROR_STUB_LIBRARY means no driver was found)"
        ))
    })
}

#[cfg(not(feature = "cuda"))]
fn cuda() -> Result<Device> {
    Err(Error::Device(String::from(
        "device = \"cuda\" needs a build with the `cuda` feature: `cargo xtask build-cuda` (CUDA from PyPI \
         wheels), or `cargo build --release -p rl-cli --features cuda` where CUDA is installed",
    )))
}

/// The candle dtype of a config's `dtype`.
pub fn compute_dtype(dtype: rl_configs::Dtype) -> DType {
    match dtype {
        rl_configs::Dtype::F32 => DType::F32,
        rl_configs::Dtype::Bf16 => DType::BF16,
        rl_configs::Dtype::F16 => DType::F16,
    }
}
