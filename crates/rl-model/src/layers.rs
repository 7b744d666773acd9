//! Building blocks written only with differentiable candle ops (candle-nn's fused `rms_norm`,
//! `rope`, `softmax_last_dim` and sdpa have no backward pass: gradients would silently stop).

use candle_core::{D, DType, Device, Tensor};

use crate::error::Result;

/// RMSNorm over the last dimension: `x / sqrt(mean(x^2) + eps) * w`.
pub(crate) fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let var = x.sqr()?.mean_keepdim(D::Minus1)?;
    Ok(x.broadcast_div(&(var + eps)?.sqrt()?)?.broadcast_mul(w)?)
}

/// Rotary tables: cos and sin of `position * inv_freq`, `[max_positions, head_dim / 2]`.
#[derive(Debug, Clone)]
pub(crate) struct Rope {
    cos: Tensor,
    sin: Tensor,
}

impl Rope {
    /// Tables computed in f64, stored in `dtype`.
    pub(crate) fn new(
        head_dim: usize,
        theta: f64,
        max_positions: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let half = head_dim / 2;
        let inv: Vec<f64> = (0..half).map(|i| 1.0 / theta.powf(2.0 * i as f64 / head_dim as f64)).collect();
        let freqs: Vec<f64> = (0..max_positions).flat_map(|p| inv.iter().map(move |f| p as f64 * f)).collect();
        let cos: Vec<f64> = freqs.iter().map(|x| x.cos()).collect();
        let sin: Vec<f64> = freqs.iter().map(|x| x.sin()).collect();
        Ok(Rope {
            cos: Tensor::from_vec(cos, (max_positions, half), device)?.to_dtype(dtype)?,
            sin: Tensor::from_vec(sin, (max_positions, half), device)?.to_dtype(dtype)?,
        })
    }

    /// Rotates `x` `[B, heads, T, D]` at `positions` `[B, T]` (HF's rotate-half convention).
    pub(crate) fn apply(&self, x: &Tensor, positions: &Tensor) -> Result<Tensor> {
        let (b, _, t, d) = x.dims4()?;
        let half = d / 2;
        let flat = positions.flatten_all()?;
        let cos = self.cos.index_select(&flat, 0)?.reshape((b, 1, t, half))?;
        let sin = self.sin.index_select(&flat, 0)?.reshape((b, 1, t, half))?;
        let x1 = x.narrow(D::Minus1, 0, half)?;
        let x2 = x.narrow(D::Minus1, half, half)?;
        let r1 = (x1.broadcast_mul(&cos)? - x2.broadcast_mul(&sin)?)?;
        let r2 = (x2.broadcast_mul(&cos)? + x1.broadcast_mul(&sin)?)?;
        Ok(Tensor::cat(&[r1, r2], D::Minus1)?)
    }
}

/// Repeats key/value heads `[B, kv, T, D]` to `[B, kv * n_rep, T, D]`.
pub(crate) fn repeat_kv(x: &Tensor, n_rep: usize) -> Result<Tensor> {
    if n_rep == 1 {
        return Ok(x.clone());
    }
    let (b, kv, t, d) = x.dims4()?;
    Ok(x.unsqueeze(2)?.broadcast_as((b, kv, n_rep, t, d))?.contiguous()?.reshape((b, kv * n_rep, t, d))?)
}

/// Additive attention mask `[B, 1, T, T]` for packed rows: token i sees token j when both belong
/// to the same sample and j <= i. A sample starts wherever its position restarts (is not the
/// previous position + 1).
pub(crate) fn packed_mask(positions: &[Vec<u32>], dtype: DType, device: &Device) -> Result<Tensor> {
    let b = positions.len();
    let t = positions.first().map_or(0, Vec::len);
    let mut data = vec![f32::NEG_INFINITY; b * t * t];
    for (row, pos) in positions.iter().enumerate() {
        let mut seg = vec![0usize; t];
        for i in 1..t {
            seg[i] = if pos[i] == pos[i - 1] + 1 { seg[i - 1] } else { seg[i - 1] + 1 };
        }
        for i in 0..t {
            for j in 0..=i {
                if seg[j] == seg[i] {
                    data[row * t * t + i * t + j] = 0.0;
                }
            }
        }
    }
    Ok(Tensor::from_vec(data, (b, 1, t, t), device)?.to_dtype(dtype)?)
}

/// Causal mask `[1, 1, T, past + T]` for T new tokens after `past` cached ones.
pub(crate) fn causal_mask(t: usize, past: usize, dtype: DType, device: &Device) -> Result<Tensor> {
    let total = past + t;
    let data: Vec<f32> =
        (0..t).flat_map(|i| (0..total).map(move |j| if j <= past + i { 0.0 } else { f32::NEG_INFINITY })).collect();
    Ok(Tensor::from_vec(data, (1, 1, t, total), device)?.to_dtype(dtype)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_mask_blocks_cross_sample_attention() {
        let m = packed_mask(&[vec![0, 1, 2, 0, 1]], DType::F32, &Device::Cpu).unwrap();
        let m: Vec<Vec<f32>> = m.squeeze(0).unwrap().squeeze(0).unwrap().to_vec2().unwrap();
        let allowed = |i: usize, j: usize| m[i][j] == 0.0;
        assert!(allowed(2, 0) && allowed(2, 2) && !allowed(2, 3));
        assert!(allowed(4, 3) && !allowed(4, 2) && !allowed(3, 4));
    }
}
