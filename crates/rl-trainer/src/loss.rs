//! The RL loss of one packed micro-batch (design.md section 7, prime-rl's default loss):
//!
//! ```text
//! lp  = log_softmax(z / T_t)[token]        z: logits predicting token t, T_t: its temperature
//! ratio = exp(lp - lmu), dp = exp(lp) - exp(lmu)      lmu: inference logprob
//! masked when A > 0 and dp > mask_high, or A <= 0 and dp < -mask_low
//! rl_t = -(keep * adv_tau * A * ratio) + kl_tau * M * (lp - lmu)^2, times rl_weight
//! ce_t = -lp * ce_weight
//! loss = sum(rl) / N_rl + sum(ce) / N_ce      (token counts over the whole step)
//! ```
//! `M` = loss_mask and rl_weight != 0; the first token of a sample is never a target.

use candle_core::{D, DType, Tensor};
use rl_configs::LossConfig;
use rl_model::Qwen3;
use rl_proto::train::v1::MicroBatch;

use crate::error::Result;

/// Loss-member token counts over a whole step (the normalisers).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepCounts {
    /// Tokens in the rl component.
    pub rl: usize,
    /// Tokens in the ce component.
    pub ce: usize,
}

/// Per-token membership of one micro-batch, shifted to targets `1..T`.
struct Members {
    rl: Vec<bool>,
    rl_weight: Vec<f32>,
    ce_weight: Vec<f32>,
}

fn members(mb: &MicroBatch) -> Members {
    let n = mb.input_ids.len();
    let mut m = Members { rl: Vec::new(), rl_weight: Vec::new(), ce_weight: Vec::new() };
    for i in 1..n {
        let target = mb.position_ids[i] != 0;
        let w = if mb.rl_weights.is_empty() { 1.0 } else { mb.rl_weights[i] };
        m.rl.push(target && mb.loss_mask[i] && w != 0.0);
        m.rl_weight.push(w);
        m.ce_weight.push(if target && !mb.ce_weights.is_empty() { mb.ce_weights[i] } else { 0.0 });
    }
    m
}

/// Counts the rl and ce members of a step's micro-batches.
pub fn step_counts(mbs: &[MicroBatch]) -> StepCounts {
    let mut c = StepCounts::default();
    for mb in mbs {
        let m = members(mb);
        c.rl += m.rl.iter().filter(|x| **x).count();
        c.ce += m.ce_weight.iter().filter(|w| **w != 0.0).count();
    }
    c
}

/// Sums of loss statistics (divide by the counts to report means).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LossStats {
    /// The rl component's contribution to the loss.
    pub rl_loss: f64,
    /// The ce component's contribution.
    pub ce_loss: f64,
    /// Sum of `ratio - log ratio - 1` over rl members.
    pub mismatch_kl: f64,
    /// Sum of entropy over loss-mask tokens.
    pub entropy: f64,
    /// Loss-mask tokens (entropy denominator).
    pub entropy_tokens: usize,
    /// rl members masked by the low test.
    pub masked_low: usize,
    /// rl members masked by the high test.
    pub masked_high: usize,
    /// rl members.
    pub rl_tokens: usize,
}

impl LossStats {
    /// Adds another micro-batch's sums.
    pub fn add(&mut self, o: &LossStats) {
        self.rl_loss += o.rl_loss;
        self.ce_loss += o.ce_loss;
        self.mismatch_kl += o.mismatch_kl;
        self.entropy += o.entropy;
        self.entropy_tokens += o.entropy_tokens;
        self.masked_low += o.masked_low;
        self.masked_high += o.masked_high;
        self.rl_tokens += o.rl_tokens;
    }
}

/// Trainer log-probabilities `[T - 1]` of tokens `1..T` under `logits / temperature` (differentiable),
/// and the full log-softmax rows (for entropy).
pub fn token_logprobs(model: &Qwen3, mb: &MicroBatch) -> Result<(Tensor, Tensor)> {
    let n = mb.input_ids.len();
    let logits = model
        .forward_packed(std::slice::from_ref(&mb.input_ids), std::slice::from_ref(&mb.position_ids))?
        .squeeze(0)?;
    let dtype = logits.dtype();
    let z = logits.narrow(0, 0, n - 1)?;
    let temps = Tensor::from_vec(mb.temperatures[1..].to_vec(), (n - 1, 1), logits.device())?.to_dtype(dtype)?;
    let logp = candle_nn::ops::log_softmax(&z.broadcast_div(&temps)?, D::Minus1)?;
    let targets = Tensor::from_vec(mb.input_ids[1..].to_vec(), (n - 1, 1), logits.device())?;
    let lp = logp.gather(&targets, 1)?.squeeze(1)?;
    Ok((lp, logp))
}

/// The loss of one micro-batch, already divided by the step's counts, and its statistics.
pub fn micro_loss(model: &Qwen3, mb: &MicroBatch, cfg: &LossConfig, counts: StepCounts) -> Result<(Tensor, LossStats)> {
    let n = mb.input_ids.len();
    let device = model.device().clone();
    let mut stats = LossStats::default();
    if n < 2 {
        return Ok((Tensor::zeros((), DType::F32, &device)?, stats));
    }
    let (lp, logp) = token_logprobs(model, mb)?;
    let dtype = lp.dtype();
    let lp_v: Vec<f64> = lp.to_dtype(DType::F64)?.to_vec1()?;
    let m = members(mb);
    let (mut c_ratio, mut c_kl, mut c_ce) = (vec![0f64; n - 1], vec![0f64; n - 1], vec![0f64; n - 1]);
    let lmu: Vec<f64> = mb.inference_logprobs[1..].iter().map(|&x| f64::from(x)).collect();
    for j in 0..n - 1 {
        let i = j + 1;
        if m.rl[j] {
            let a = f64::from(mb.advantages[i]);
            let dp = lp_v[j].exp() - lmu[j].exp();
            let (low, high) = (a <= 0.0 && dp < -cfg.mask_low, a > 0.0 && dp > cfg.mask_high);
            let w = f64::from(m.rl_weight[j]);
            if !(low || high) {
                c_ratio[j] = -cfg.adv_tau * a * w;
            }
            c_kl[j] = cfg.kl_tau * w;
            stats.rl_tokens += 1;
            stats.masked_low += usize::from(low);
            stats.masked_high += usize::from(high);
            let log_ratio = lp_v[j] - lmu[j];
            stats.mismatch_kl += log_ratio.exp() - log_ratio - 1.0;
        }
        c_ce[j] = -f64::from(m.ce_weight[j]);
    }
    let t = |v: Vec<f64>| -> Result<Tensor> { Ok(Tensor::from_vec(v, n - 1, &device)?.to_dtype(dtype)?) };
    let lmu_t = t(lmu)?;
    let log_ratio = (&lp - &lmu_t)?;
    let rl = ((t(c_ratio)? * log_ratio.exp()?)?.sum_all()? + (t(c_kl)? * log_ratio.sqr()?)?.sum_all()?)?;
    let ce = (t(c_ce)? * &lp)?.sum_all()?;
    let rl = (rl / counts.rl.max(1) as f64)?;
    let ce = (ce / counts.ce.max(1) as f64)?;
    stats.rl_loss = rl.to_dtype(DType::F64)?.to_scalar()?;
    stats.ce_loss = ce.to_dtype(DType::F64)?.to_scalar()?;
    // Entropy of the sampling distribution over loss-mask tokens (no gradient needed).
    let ent: Vec<f64> = (logp.exp()? * &logp)?.sum(D::Minus1)?.neg()?.to_dtype(DType::F64)?.to_vec1()?;
    for (j, e) in ent.iter().enumerate() {
        if mb.loss_mask[j + 1] && mb.position_ids[j + 1] != 0 {
            stats.entropy += e;
            stats.entropy_tokens += 1;
        }
    }
    Ok(((rl + ce)?, stats))
}
