//! The RL loss of one packed micro-batch (design.md section 7, prime-rl's default loss):
//!
//! ```text
//! lp  = log_softmax(z / T_t)[token]        z: logits predicting token t, T_t: its temperature
//! ratio = exp(lp - lmu), dp = exp(lp) - exp(lmu)      lmu: inference logprob
//! masked when A > 0 and dp > mask_high, or A <= 0 and dp < -mask_low
//! rl_t = -(keep * adv_tau * A * ratio) + kl_tau * M * (lp - lmu)^2
//! ce_t = -lp * ce_weight
//! loss = sum(rl) / N_rl + sum(ce) / N_ce      (token counts over the whole step)
//! ```
//! `M` = loss_mask. Only tokens in some loss (or in the loss mask, for the
//! entropy statistic) are scored: their source rows alone go through the output head, and the
//! temperature log-softmax, gather and entropy are one fused op.

use std::sync::Arc;

use candle_core::{DType, Tensor};
use rl_configs::LossConfig;
use rl_model::{CausalLm, Pass, RowLayout, Targets};
use rl_proto::train::v1::MicroBatch;

use crate::error::{Error, Result};

/// Loss-member token counts over a whole step (the normalisers).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepCounts {
    /// Tokens in the rl component.
    pub rl: usize,
    /// Tokens in the ce component.
    pub ce: usize,
}

/// The row's layout: its samples and their parents.
pub fn row_layout(mb: &MicroBatch) -> Result<RowLayout> {
    let lens: Vec<usize> = mb.seq_lens.iter().map(|&l| l as usize).collect();
    let parents: Vec<Option<usize>> = if mb.parents.is_empty() {
        vec![None; lens.len()]
    } else {
        mb.parents.iter().map(|&p| usize::try_from(p).ok()).collect()
    };
    RowLayout::new(&lens, &parents).map_err(|e| Error::Layout(format!("seq_lens/parents: {e}")))
}

/// Per-token membership of one micro-batch: which tokens are targets of which loss.
struct Members {
    /// Target tokens (index in the row) that are scored, in row order.
    tokens: Vec<usize>,
    /// Their source rows.
    sources: Vec<usize>,
    rl: Vec<bool>,
    ce_weight: Vec<f32>,
}

fn members(mb: &MicroBatch, layout: &RowLayout) -> Members {
    let mut m = Members { tokens: Vec::new(), sources: Vec::new(), rl: Vec::new(), ce_weight: Vec::new() };
    for (i, src) in layout.sources().into_iter().enumerate() {
        let Some(src) = src else { continue };
        let ce = if mb.ce_weights.is_empty() { 0.0 } else { mb.ce_weights[i] };
        if !mb.loss_mask[i] && ce == 0.0 {
            continue;
        }
        m.tokens.push(i);
        m.sources.push(src);
        m.rl.push(mb.loss_mask[i]);
        m.ce_weight.push(ce);
    }
    m
}

/// Counts the rl and ce members of a step's micro-batches.
pub fn step_counts(mbs: &[MicroBatch]) -> Result<StepCounts> {
    let mut c = StepCounts::default();
    for mb in mbs {
        let m = members(mb, &row_layout(mb)?);
        c.rl += m.rl.iter().filter(|x| **x).count();
        c.ce += m.ce_weight.iter().filter(|w| **w != 0.0).count();
    }
    Ok(c)
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

/// The trainer's log-probabilities of a row's scored tokens.
#[derive(Debug)]
pub struct TokenLogprobs {
    /// Scored tokens (index in the row), in row order.
    pub tokens: Vec<usize>,
    /// `log_softmax(z / T)[token]` of each (differentiable), `[tokens.len()]`.
    pub lp: Tensor,
    /// Entropy of each token's sampling distribution (a statistic).
    pub entropy: Vec<f64>,
}

/// Log-probabilities of the tokens of `mb` that some loss or the loss mask needs.
pub fn token_logprobs(model: &CausalLm, mb: &MicroBatch) -> Result<TokenLogprobs> {
    let layout = row_layout(mb)?;
    let m = members(mb, &layout);
    scored(model, mb, &Arc::new(layout), &m, Pass::Eval)
}

fn scored(
    model: &CausalLm,
    mb: &MicroBatch,
    layout: &Arc<RowLayout>,
    m: &Members,
    pass: Pass,
) -> Result<TokenLogprobs> {
    let device = model.device();
    let hidden = model.hidden_in(&mb.input_ids, layout, pass)?;
    // The output head runs only on rows that predict a scored token (each once).
    let mut rows: Vec<u32> = m.sources.iter().map(|&s| s as u32).collect();
    rows.sort_unstable();
    rows.dedup();
    let row_of = |s: usize| rows.binary_search(&(s as u32)).expect("every source is a selected row") as u32;
    let targets = Arc::new(Targets {
        rows: m.sources.iter().map(|&s| row_of(s)).collect(),
        ids: m.tokens.iter().map(|&i| mb.input_ids[i]).collect(),
        temps: m.tokens.iter().map(|&i| mb.temperatures[i]).collect(),
    });
    let picked = hidden.index_select(&Tensor::from_vec(rows.clone(), rows.len(), device)?, 0)?;
    let out = rl_kernels::ops::head_logprobs(&picked, &model.head_weight()?, targets)?;
    let entropy = out.narrow(1, 1, 1)?.squeeze(1)?.to_dtype(DType::F64)?.to_vec1()?;
    Ok(TokenLogprobs { tokens: m.tokens.clone(), lp: out.narrow(1, 0, 1)?.squeeze(1)?, entropy })
}

/// The loss of one micro-batch, already divided by the step's counts, and its statistics; `pass`
/// says whether adapter dropout draws masks (a training step) or not (validation).
pub fn micro_loss(
    model: &CausalLm,
    mb: &MicroBatch,
    cfg: &LossConfig,
    counts: StepCounts,
    pass: Pass,
) -> Result<(Tensor, LossStats)> {
    let device = model.device().clone();
    let mut stats = LossStats::default();
    let layout = row_layout(mb)?;
    let m = members(mb, &layout);
    if m.tokens.is_empty() {
        return Ok((Tensor::zeros((), DType::F32, &device)?, stats));
    }
    let scored = scored(model, mb, &Arc::new(layout), &m, pass)?;
    let lp = &scored.lp;
    let (dtype, n) = (lp.dtype(), m.tokens.len());
    let lp_v: Vec<f64> = lp.to_dtype(DType::F64)?.to_vec1()?;
    let (mut c_ratio, mut c_kl, mut c_ce) = (vec![0f64; n], vec![0f64; n], vec![0f64; n]);
    let lmu: Vec<f64> = m.tokens.iter().map(|&i| f64::from(mb.inference_logprobs[i])).collect();
    for j in 0..n {
        let i = m.tokens[j];
        if m.rl[j] {
            let a = f64::from(mb.advantages[i]);
            let dp = lp_v[j].exp() - lmu[j].exp();
            let (low, high) = (a <= 0.0 && dp < -cfg.mask_low, a > 0.0 && dp > cfg.mask_high);
            if !(low || high) {
                c_ratio[j] = -cfg.adv_tau * a;
            }
            c_kl[j] = cfg.kl_tau;
            stats.rl_tokens += 1;
            stats.masked_low += usize::from(low);
            stats.masked_high += usize::from(high);
            let log_ratio = lp_v[j] - lmu[j];
            stats.mismatch_kl += log_ratio.exp() - log_ratio - 1.0;
        }
        c_ce[j] = -f64::from(m.ce_weight[j]);
        if mb.loss_mask[i] {
            stats.entropy += scored.entropy[j];
            stats.entropy_tokens += 1;
        }
    }
    let t = |v: Vec<f64>| -> Result<Tensor> { Ok(Tensor::from_vec(v, n, &device)?.to_dtype(dtype)?) };
    let log_ratio = (lp - &t(lmu)?)?;
    let rl = ((t(c_ratio)? * log_ratio.exp()?)?.sum_all()? + (t(c_kl)? * log_ratio.sqr()?)?.sum_all()?)?;
    let ce = (t(c_ce)? * lp)?.sum_all()?;
    let rl = (rl / counts.rl.max(1) as f64)?;
    let ce = (ce / counts.ce.max(1) as f64)?;
    stats.rl_loss = rl.to_dtype(DType::F64)?.to_scalar()?;
    stats.ce_loss = ce.to_dtype(DType::F64)?.to_scalar()?;
    Ok(((rl + ce)?, stats))
}
