//! The row-wise steps of blocked attention over a block's score matrix `[heads x rows, keys]`: the
//! scaled, masked softmax and its backward. On CUDA (f32, bf16) each is one kernel
//! (`kernels.cu`, compiled once per process by NVRTC; launched by `cuda.rs`); elsewhere the same math in candle
//! ops, which is what the CPU tests check the whole blocked attention with.

use candle_core::{D, DType, Tensor};

/// `x` in at least f32 (f64 stays f64).
fn f32_of(x: &Tensor) -> candle_core::Result<Tensor> {
    if x.dtype() == DType::F64 { Ok(x.clone()) } else { x.to_dtype(DType::F32) }
}

/// `softmax(s * scale + mask)` over the last dimension in f32 at least, returned in `s`'s dtype.
/// `s` is `[.., n, keys]` whose rows are the `mask [rows, keys]`'s query rows repeated (every
/// head's `rows` rows in turn); `mask` holds 0 or -inf, in `s`'s dtype.
pub(crate) fn masked_softmax(s: &Tensor, mask: &Tensor, scale: f64) -> candle_core::Result<Tensor> {
    #[cfg(feature = "cuda")]
    if cuda::takes(s) {
        return cuda::masked_softmax(s, mask, scale);
    }
    let (rows, keys) = mask.dims2()?;
    let x = f32_of(s)?.reshape((s.elem_count() / (rows * keys), rows, keys))?;
    let mask = mask.to_dtype(x.dtype())?;
    let x = (x * scale)?.broadcast_add(&mask)?;
    let max = x.max_keepdim(D::Minus1)?;
    let e = x.broadcast_sub(&max)?.exp()?;
    e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?.to_dtype(s.dtype())?.reshape(s.shape())
}

/// The gradient of the unscaled scores from the probabilities `p` and their gradient `dp` (same
/// shape): `scale * p * (dp - sum(p * dp))` per row, in f32 at least, returned in `p`'s dtype.
pub(crate) fn softmax_grad(p: &Tensor, dp: &Tensor, scale: f64) -> candle_core::Result<Tensor> {
    #[cfg(feature = "cuda")]
    if cuda::takes(p) {
        return cuda::softmax_grad(p, dp, scale);
    }
    let (pf, dpf) = (f32_of(p)?, f32_of(dp)?);
    let dot = (&pf * &dpf)?.sum_keepdim(D::Minus1)?;
    ((pf * dpf.broadcast_sub(&dot)?)? * scale)?.to_dtype(p.dtype())
}

#[cfg(feature = "cuda")]
mod cuda;
