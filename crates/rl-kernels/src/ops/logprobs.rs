//! Temperature-scaled log-softmax + gather + entropy over the vocabulary as one differentiable
//! candle op: `[N, 2]` (log-probability, entropy) for N targets read from rows of `[R, V]` logits.

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor, WithDType};

use super::access::{CpuKernel, cpu_dispatch, on_cpu, op_error, slice, tensor};
use crate::cpu::logprobs::{Targets, logprobs_backward, logprobs_forward};
use crate::float::Real;

const LP: &str = "token_logprobs";

struct TokenLogprobs {
    targets: Arc<Targets>,
}

impl TokenLogprobs {
    fn check(&self, shape: &Shape) -> candle_core::Result<usize> {
        let (rows, vocab) = shape.dims2().map_err(|_| op_error(LP, "logits must be [rows, vocab]"))?;
        let t = &self.targets;
        if t.ids.len() != t.len() || t.temps.len() != t.len() {
            return Err(op_error(LP, "rows, ids and temperatures differ in length"));
        }
        if let Some(r) = t.rows.iter().find(|&&r| r as usize >= rows) {
            return Err(op_error(LP, format!("row {r} is outside {rows} rows of logits")));
        }
        if let Some(i) = t.ids.iter().find(|&&i| i as usize >= vocab) {
            return Err(op_error(LP, format!("token {i} is outside the vocabulary of {vocab}")));
        }
        if let Some(x) = t.temps.iter().find(|&&x| !(x > 0.0 && x.is_finite())) {
            return Err(op_error(LP, format!("temperature {x} is not positive and finite")));
        }
        Ok(vocab)
    }
}

impl CustomOp1 for TokenLogprobs {
    fn name(&self) -> &'static str {
        LP
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let vocab = self.check(l.shape())?;
        cpu_dispatch!(LP, s, |T| {
            let out = logprobs_forward(slice::<T>(LP, s, l)?, vocab, &self.targets);
            Ok((T::to_cpu_storage_owned(out), Shape::from((self.targets.len(), 2))))
        })
    }

    fn bwd(&self, z: &Tensor, _res: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        struct K<'a> {
            op: &'a TokenLogprobs,
            z: &'a Tensor,
        }
        impl CpuKernel for K<'_> {
            type Out = Tensor;
            fn run<T: Real + WithDType>(self, xs: &[&[T]]) -> candle_core::Result<Tensor> {
                let vocab = self.z.dim(1)?;
                let d_lp: Vec<T> = xs[1].chunks(2).map(|c| c[0]).collect();
                tensor(logprobs_backward(xs[0], vocab, &self.op.targets, &d_lp), self.z.shape())
            }
        }
        let grad = grad.contiguous()?;
        Ok(Some(on_cpu(LP, &[z, &grad], K { op: self, z })?))
    }
}

/// `[N, 2]`: column 0 the log-probability of each target under `softmax(logits[row] / temp)`
/// (differentiable), column 1 that distribution's entropy (a statistic: it passes no gradient).
pub fn token_logprobs(logits: &Tensor, targets: Arc<Targets>) -> candle_core::Result<Tensor> {
    if !super::runs_fused(logits) {
        TokenLogprobs { targets: targets.clone() }.check(logits.shape())?;
        return super::composed::token_logprobs(logits, &targets);
    }
    logits.contiguous()?.apply_op1(TokenLogprobs { targets })
}
