//! The algorithm registry: each algorithm turns a group of traces into per-branch channels
//! (`values` + `mask` for one loss: rl advantages or ce weights). Channels of the same loss are
//! summed; dimensions are checked against each branch's tokens.

use rl_configs::{AlgorithmConfig, BuiltinAlgorithm, LossChannel};
use rl_serve::{branches, pb};

use crate::error::{Error, Result};

/// One algorithm's output for one branch.
#[derive(Debug, Clone, PartialEq)]
pub struct Channel {
    /// Which trainer loss it feeds.
    pub loss: LossChannel,
    /// Per-token values (advantages for rl, weights for ce).
    pub values: Vec<f32>,
    /// Per-token: where the values apply.
    pub mask: Vec<bool>,
}

/// An algorithm the orchestrator runs itself.
#[derive(Debug, Clone, PartialEq)]
pub enum Algorithm {
    /// A = r - mean(r) over the group's clean traces.
    Grpo,
    /// A = (r - m) / m with m the clean mean, 0 when m <= 0.
    MaxRl,
    /// A = r.
    Rl,
}

impl Algorithm {
    /// The algorithm for a config entry; unbuilt ones are refused loudly, not skipped.
    pub fn from_config(cfg: &AlgorithmConfig) -> Result<Self> {
        match cfg {
            AlgorithmConfig::Builtin(BuiltinAlgorithm::Grpo {}) => Ok(Algorithm::Grpo),
            AlgorithmConfig::Builtin(BuiltinAlgorithm::MaxRl {}) => Ok(Algorithm::MaxRl),
            AlgorithmConfig::Builtin(BuiltinAlgorithm::Rl {}) => Ok(Algorithm::Rl),
            other => Err(Error::NotImplemented(other.id().to_owned())),
        }
    }

    /// The id.
    pub fn id(&self) -> &'static str {
        match self {
            Algorithm::Grpo => "grpo",
            Algorithm::MaxRl => "max_rl",
            Algorithm::Rl => "rl",
        }
    }

    /// Trace-level advantage of each trace (`None` for traces with errors).
    pub fn advantages(&self, traces: &[pb::Trace]) -> Vec<Option<f64>> {
        let clean: Vec<f64> = traces.iter().filter(|t| t.errors.is_empty()).map(|t| t.reward).collect();
        let mean = if clean.is_empty() { 0.0 } else { clean.iter().sum::<f64>() / clean.len() as f64 };
        traces
            .iter()
            .map(|t| {
                if !t.errors.is_empty() {
                    return None;
                }
                Some(match self {
                    Algorithm::Grpo => t.reward - mean,
                    Algorithm::MaxRl if mean > 0.0 => (t.reward - mean) / mean,
                    Algorithm::MaxRl => 0.0,
                    Algorithm::Rl => t.reward,
                })
            })
            .collect()
    }

    /// Channels per trace, per branch: the trace advantage on every sampled token.
    pub fn channels(&self, traces: &[pb::Trace]) -> Vec<Vec<Channel>> {
        traces
            .iter()
            .zip(self.advantages(traces))
            .map(|(t, adv)| match adv {
                None => Vec::new(),
                Some(a) => branches(t)
                    .into_iter()
                    .map(|b| Channel {
                        loss: LossChannel::Rl,
                        values: b.mask.iter().map(|m| if *m { a as f32 } else { 0.0 }).collect(),
                        mask: b.mask,
                    })
                    .collect(),
            })
            .collect()
    }
}

/// Summed channels of one branch: rl advantages and ce weights (zero where no channel applies).
#[derive(Debug, Clone, PartialEq)]
pub struct BranchTargets {
    /// rl advantages per token.
    pub advantages: Vec<f32>,
    /// Tokens some rl channel applies to.
    pub rl_mask: Vec<bool>,
    /// ce weights per token.
    pub ce_weights: Vec<f32>,
}

/// Checks every channel against its branch and sums channels of the same loss.
/// `outputs[a][t][b]` is algorithm `a`'s channel for branch `b` of trace `t` (missing = none).
pub fn aggregate(ids: &[&str], traces: &[pb::Trace], outputs: &[Vec<Vec<Channel>>]) -> Result<Vec<Vec<BranchTargets>>> {
    let mut out: Vec<Vec<BranchTargets>> = traces
        .iter()
        .map(|t| {
            branches(t)
                .into_iter()
                .map(|b| {
                    let n = b.token_ids.len();
                    BranchTargets { advantages: vec![0.0; n], rl_mask: vec![false; n], ce_weights: vec![0.0; n] }
                })
                .collect()
        })
        .collect();
    for (a, per_trace) in outputs.iter().enumerate() {
        for (t, per_branch) in per_trace.iter().enumerate() {
            for (b, ch) in per_branch.iter().enumerate() {
                let target = out.get_mut(t).and_then(|bs| bs.get_mut(b)).ok_or_else(|| Error::Dimensions {
                    algorithm: ids.get(a).copied().unwrap_or("?").to_owned(),
                    trace: t,
                    branch: b,
                    tokens: 0,
                    values: ch.values.len(),
                    mask: ch.mask.len(),
                })?;
                let n = target.advantages.len();
                if ch.values.len() != n || ch.mask.len() != n {
                    return Err(Error::Dimensions {
                        algorithm: ids.get(a).copied().unwrap_or("?").to_owned(),
                        trace: t,
                        branch: b,
                        tokens: n,
                        values: ch.values.len(),
                        mask: ch.mask.len(),
                    });
                }
                for i in 0..n {
                    if !ch.mask[i] {
                        continue;
                    }
                    match ch.loss {
                        LossChannel::Rl => {
                            target.advantages[i] += ch.values[i];
                            target.rl_mask[i] = true;
                        }
                        LossChannel::Ce => target.ce_weights[i] += ch.values[i],
                    }
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace(reward: f64, tokens: usize, error: bool) -> pb::Trace {
        pb::Trace {
            reward,
            nodes: vec![
                pb::MessageNode {
                    parent: -1,
                    role: String::from("user"),
                    token_ids: vec![1, 2],
                    mask: vec![false, false],
                    ..Default::default()
                },
                pb::MessageNode {
                    parent: 0,
                    role: String::from("assistant"),
                    sampled: true,
                    token_ids: vec![7; tokens],
                    mask: vec![true; tokens],
                    logprobs: vec![-0.5; tokens],
                    ..Default::default()
                },
            ],
            errors: if error {
                vec![pb::TraceError { message: String::from("boom"), ..Default::default() }]
            } else {
                vec![]
            },
            ..Default::default()
        }
    }

    #[test]
    fn builtin_advantages_by_hand() {
        let group = [trace(1.0, 2, false), trace(0.0, 2, false), trace(0.5, 2, false), trace(9.0, 2, true)];
        // Clean rewards 1, 0, 0.5: mean 0.5. The errored trace gets nothing and is not in the mean.
        assert_eq!(Algorithm::Grpo.advantages(&group), vec![Some(0.5), Some(-0.5), Some(0.0), None]);
        assert_eq!(Algorithm::MaxRl.advantages(&group), vec![Some(1.0), Some(-1.0), Some(0.0), None]);
        assert_eq!(Algorithm::Rl.advantages(&group), vec![Some(1.0), Some(0.0), Some(0.5), None]);
        let zero = [trace(0.0, 1, false), trace(0.0, 1, false)];
        assert_eq!(Algorithm::MaxRl.advantages(&zero), vec![Some(0.0), Some(0.0)], "m <= 0 gives 0");
    }

    #[test]
    fn channels_put_the_advantage_on_sampled_tokens_only() {
        let group = [trace(1.0, 3, false), trace(0.0, 3, false)];
        let ch = Algorithm::Grpo.channels(&group);
        assert_eq!(ch[0][0].values, vec![0.0, 0.0, 0.5, 0.5, 0.5]);
        assert_eq!(ch[0][0].mask, vec![false, false, true, true, true]);
        assert_eq!(ch[1][0].values, vec![0.0, 0.0, -0.5, -0.5, -0.5]);
    }

    #[test]
    fn same_loss_channels_sum_and_bad_dimensions_are_errors() {
        let group = [trace(1.0, 2, false), trace(0.0, 2, false)];
        let grpo = Algorithm::Grpo.channels(&group);
        let rl = Algorithm::Rl.channels(&group);
        let ce = vec![
            vec![Channel { loss: LossChannel::Ce, values: vec![0.3; 4], mask: vec![true, true, false, false] }],
            vec![],
        ];
        let agg = aggregate(&["grpo", "rl", "echo"], &group, &[grpo.clone(), rl, ce]).unwrap();
        assert_eq!(agg[0][0].advantages, vec![0.0, 0.0, 1.5, 1.5], "grpo 0.5 + rl 1.0");
        assert_eq!(agg[0][0].ce_weights, vec![0.3, 0.3, 0.0, 0.0]);
        assert_eq!(agg[1][0].advantages, vec![0.0, 0.0, -0.5, -0.5]);
        let bad = vec![vec![Channel { loss: LossChannel::Rl, values: vec![1.0; 3], mask: vec![true; 3] }], vec![]];
        let err = aggregate(&["grpo", "broken"], &group, &[grpo, bad]).unwrap_err();
        assert!(err.to_string().contains("`broken`") && err.to_string().contains("4 tokens"), "{err}");
    }

    #[test]
    fn unbuilt_algorithms_are_refused_not_skipped() {
        let err = Algorithm::from_config(&AlgorithmConfig::from_id("opd")).unwrap_err();
        assert!(err.to_string().contains("`opd` is not implemented"), "{err}");
        assert_eq!(Algorithm::from_config(&AlgorithmConfig::from_id("grpo")).unwrap(), Algorithm::Grpo);
    }
}
