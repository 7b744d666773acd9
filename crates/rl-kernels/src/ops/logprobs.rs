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

/// Logits held at once by [`head_logprobs`] off the fused kernels: 2^27 (512 MiB in f32).
const MAX_HEAD_LOGITS: usize = 1 << 27;

/// [`token_logprobs`] of the logits `hidden W^T` (`hidden [R, H]`, the output head `W [V, H]`).
/// On CPU the fused ops; elsewhere the targets go through the head a chunk at a time, and when a
/// gradient is wanted no chunk's logits are kept: the backward recomputes them chunk by chunk, so
/// a 16k-token row of a 152k vocabulary holds ~512 MiB of logits rather than tens of GB.
pub fn head_logprobs(hidden: &Tensor, weight: &Tensor, targets: Arc<Targets>) -> candle_core::Result<Tensor> {
    if super::runs_fused(hidden) {
        return token_logprobs(&super::linear(hidden, weight)?, targets);
    }
    let rows = hidden.dim(0)?;
    let vocab = weight.dim(0)?;
    TokenLogprobs { targets: targets.clone() }.check(&Shape::from((rows, vocab)))?;
    super::recompute::apply(HeadLogprobs { targets, max_logits: MAX_HEAD_LOGITS }, &[hidden, weight])
}

/// [`head_logprobs`] computed (and differentiated) a chunk of targets at a time.
pub(crate) struct HeadLogprobs {
    pub(crate) targets: Arc<Targets>,
    pub(crate) max_logits: usize,
}

impl HeadLogprobs {
    /// Ranges of target indices, each with at most `max_logits` logits.
    fn chunks(&self, vocab: usize) -> Vec<std::ops::Range<usize>> {
        let n = self.targets.len();
        let size = (self.max_logits / vocab.max(1)).max(1);
        (0..n).step_by(size).map(|a| a..(a + size).min(n)).collect()
    }

    /// `[len, 2]` of the targets in `r`.
    fn chunk(&self, hidden: &Tensor, weight: &Tensor, r: std::ops::Range<usize>) -> candle_core::Result<Tensor> {
        let t = &self.targets;
        let rows = Tensor::new(&t.rows[r.clone()], hidden.device())?;
        let sub =
            Targets { rows: (0..r.len() as u32).collect(), ids: t.ids[r.clone()].to_vec(), temps: t.temps[r].to_vec() };
        super::composed::token_logprobs(&super::linear(&hidden.index_select(&rows, 0)?, weight)?, &sub)
    }
}

impl super::recompute::Recomputed for HeadLogprobs {
    fn name(&self) -> &'static str {
        LP
    }

    fn eval(&self, xs: &[Tensor]) -> candle_core::Result<Tensor> {
        let [h, w] = xs else { return Err(op_error(LP, "takes the hidden rows and the head")) };
        let outs =
            self.chunks(w.dim(0)?).into_iter().map(|r| self.chunk(h, w, r)).collect::<candle_core::Result<Vec<_>>>()?;
        if outs.is_empty() { Tensor::zeros((0, 2), candle_core::DType::F32, h.device()) } else { Tensor::cat(&outs, 0) }
    }

    fn grads(&self, xs: &[&Tensor], dy: &Tensor) -> candle_core::Result<Vec<Option<Tensor>>> {
        use super::recompute::{accumulate, collect, tensors, variables};
        let vars = variables(xs)?;
        let inputs = tensors(xs, &vars);
        let (mut dh, mut dw) = (None, None);
        for r in self.chunks(inputs[1].dim(0)?) {
            let dyc = dy.narrow(0, r.start, r.len())?.detach();
            let out = self.chunk(&inputs[0], &inputs[1], r)?;
            let store = (out * dyc)?.sum_all()?.backward()?;
            let mut g = collect(&vars, &store)?.into_iter();
            accumulate(&mut dh, g.next().flatten())?;
            accumulate(&mut dw, g.next().flatten())?;
        }
        Ok(vec![dh, dw])
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor, Var};

    use super::*;

    fn rand(shape: &[usize], seed: u64) -> Tensor {
        let n: usize = shape.iter().product();
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let data: Vec<f64> = (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
            })
            .collect();
        Tensor::from_vec(data, shape, &Device::Cpu).unwrap()
    }

    #[test]
    fn the_head_in_chunks_equals_the_whole_head_in_value_and_gradient() {
        let h = Var::from_tensor(&rand(&[5, 6], 1)).unwrap();
        let wv = Var::from_tensor(&rand(&[11, 6], 2)).unwrap();
        // Rows shared by several targets, temperatures of every kind; 2 targets per chunk.
        let targets =
            Targets { rows: vec![0, 2, 2, 4, 1], ids: vec![3, 0, 10, 5, 7], temps: vec![1.0, 0.7, 1.4, 2.0, 1.0] };
        for frozen in [false, true] {
            let w = if frozen { wv.as_tensor().detach() } else { wv.as_tensor().clone() };
            let op = HeadLogprobs { targets: Arc::new(targets.clone()), max_logits: 22 };
            let chunked = super::super::recompute::apply(op, &[h.as_tensor(), &w]).unwrap();
            let whole =
                super::super::composed::token_logprobs(&h.as_tensor().matmul(&w.t().unwrap()).unwrap(), &targets)
                    .unwrap();
            let diff =
                |a: &Tensor, b: &Tensor| (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f64>().unwrap();
            assert!(diff(&chunked, &whole) < 1e-12, "values differ");
            let probe = rand(&[5, 2], 3);
            let gc = (&chunked * &probe).unwrap().sum_all().unwrap().backward().unwrap();
            let gw = (&whole * &probe).unwrap().sum_all().unwrap().backward().unwrap();
            let dh = (gc.get(h.as_tensor()).unwrap(), gw.get(h.as_tensor()).unwrap());
            assert!(diff(dh.0, dh.1) < 1e-12, "hidden gradients differ by {}", diff(dh.0, dh.1));
            assert!(dh.0.abs().unwrap().max_all().unwrap().to_scalar::<f64>().unwrap() > 1e-3);
            if frozen {
                assert!(gc.get(wv.as_tensor()).is_none(), "a frozen head got a gradient");
            } else {
                let dw = (gc.get(wv.as_tensor()).unwrap(), gw.get(wv.as_tensor()).unwrap());
                assert!(diff(dw.0, dw.1) < 1e-12, "head gradients differ by {}", diff(dw.0, dw.1));
            }
        }
    }
}
