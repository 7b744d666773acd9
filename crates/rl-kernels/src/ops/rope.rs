//! Rotary-embedding tables (`cos`/`sin` for every position), built once per model and read by
//! the fused and composed rotations.

use candle_core::{Storage, Tensor, WithDType};

use super::access::{op_error, slice};
use crate::cpu::norm::RopeTables;

const ROPE: &str = "rope";

/// Rotary tables for every position: `cos`/`sin` `[max_positions, head_dim / 2]`.
#[derive(Debug, Clone)]
pub struct Rope {
    pub(super) cos: Tensor,
    pub(super) sin: Tensor,
}

impl Rope {
    /// Tables of `position * theta^(-2i/head_dim)`, computed in f64 and stored in `x`'s dtype.
    pub fn new(
        head_dim: usize,
        theta: f64,
        max_positions: usize,
        dtype: candle_core::DType,
        device: &candle_core::Device,
    ) -> candle_core::Result<Self> {
        let half = head_dim / 2;
        let inv: Vec<f64> = (0..half).map(|i| 1.0 / theta.powf(2.0 * i as f64 / head_dim as f64)).collect();
        Self::from_inv_freq(&inv, max_positions, dtype, device)
    }

    /// Tables of `position * inv_freq[i]` for given inverse frequencies (one per pair of
    /// dimensions: `head_dim / 2` of them), e.g. after a model's rope scaling.
    pub fn from_inv_freq(
        inv: &[f64],
        max_positions: usize,
        dtype: candle_core::DType,
        device: &candle_core::Device,
    ) -> candle_core::Result<Self> {
        let half = inv.len();
        let freqs: Vec<f64> = (0..max_positions).flat_map(|p| inv.iter().map(move |f| p as f64 * f)).collect();
        let table = |f: fn(f64) -> f64| -> candle_core::Result<Tensor> {
            Tensor::from_vec(freqs.iter().map(|&x| f(x)).collect::<Vec<f64>>(), (max_positions, half), device)?
                .to_dtype(dtype)
        };
        Ok(Rope { cos: table(f64::cos)?, sin: table(f64::sin)? })
    }

    /// The `cos` and `sin` tables.
    pub fn tables(&self) -> (&Tensor, &Tensor) {
        (&self.cos, &self.sin)
    }

    /// Rows of the tables.
    pub fn max_positions(&self) -> usize {
        self.cos.dim(0).unwrap_or(0)
    }

    /// Runs `f` on the tables' CPU data (no copy).
    pub fn with_cpu_tables<T: WithDType, R>(
        &self,
        f: impl FnOnce(RopeTables<'_, T>) -> candle_core::Result<R>,
    ) -> candle_core::Result<R> {
        let (cg, cl) = self.cos.storage_and_layout();
        let (sg, sl) = self.sin.storage_and_layout();
        match (&*cg, &*sg) {
            (Storage::Cpu(c), Storage::Cpu(s)) => f(RopeTables { cos: slice(ROPE, c, cl)?, sin: slice(ROPE, s, sl)? }),
            _ => Err(op_error(ROPE, "the rotary tables are not on the CPU")),
        }
    }
}
