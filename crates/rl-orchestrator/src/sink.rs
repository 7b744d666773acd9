//! The train sink: scored traces become training samples (one per branch: its tokens, the loss
//! mask on trained tokens, inference logprobs, the env's sampling temperature fanned out over every
//! token), and samples are packed first-fit-decreasing into rows of at most `seq_len` tokens.

use rl_proto::train::v1::MicroBatch;
use rl_serve::{branches, pb};

use crate::algorithms::BranchTargets;

/// One branch, ready to train.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainingSample {
    /// Token ids (prompt and completion).
    pub ids: Vec<u32>,
    /// Tokens the rl loss trains (non-zero advantage).
    pub loss_mask: Vec<bool>,
    /// Advantage per token.
    pub advantages: Vec<f32>,
    /// Inference logprob per token (0 on prompt tokens).
    pub inference_logprobs: Vec<f32>,
    /// Sampling temperature per token.
    pub temperatures: Vec<f32>,
    /// ce weight per token.
    pub ce_weights: Vec<f32>,
    /// Env of the sample (index into the batch's env names).
    pub env_index: u32,
}

impl TrainingSample {
    /// Tokens the sample trains in any loss.
    pub fn trained_tokens(&self) -> usize {
        self.loss_mask.iter().zip(&self.ce_weights).filter(|(m, w)| **m || **w != 0.0).count()
    }
}

/// The samples of one trace (branches with nothing to train are dropped). With `filter_zero`
/// (`orchestrator.filter_zero_advantages`), zero-advantage rl tokens are dropped from the loss mask:
/// they carry no gradient but would dilute the token normaliser. Without it they stay in the mask
/// and count towards it (a group whose advantages are all zero still trains, with no gradient).
pub fn samples(
    trace: &pb::Trace,
    targets: &[BranchTargets],
    temperature: f32,
    env_index: u32,
    filter_zero: bool,
) -> Vec<TrainingSample> {
    branches(trace)
        .into_iter()
        .zip(targets)
        .filter_map(|(b, t)| {
            let n = b.token_ids.len();
            let loss_mask: Vec<bool> =
                (0..n).map(|i| t.rl_mask[i] && (!filter_zero || t.advantages[i] != 0.0)).collect();
            let s = TrainingSample {
                ids: b.token_ids,
                loss_mask,
                advantages: t.advantages.clone(),
                inference_logprobs: b.logprobs,
                temperatures: vec![temperature; n],
                ce_weights: t.ce_weights.clone(),
                env_index,
            };
            (s.trained_tokens() > 0).then_some(s)
        })
        .collect()
}

/// Packs samples first-fit-decreasing into rows of at most `seq_len` tokens; a longer sample is
/// truncated to `seq_len`. Positions restart at 0 per sample.
pub fn pack(samples: &[TrainingSample], seq_len: usize) -> Vec<MicroBatch> {
    let mut order: Vec<usize> = (0..samples.len()).filter(|&i| !samples[i].ids.is_empty()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(samples[i].ids.len().min(seq_len)));
    let mut bins: Vec<(usize, Vec<usize>)> = Vec::new();
    for i in order {
        let len = samples[i].ids.len().min(seq_len);
        match bins.iter_mut().find(|(used, _)| used + len <= seq_len) {
            Some((used, members)) => {
                *used += len;
                members.push(i);
            }
            None => bins.push((len, vec![i])),
        }
    }
    bins.into_iter()
        .map(|(_, members)| {
            let mut row = MicroBatch::default();
            let any_ce = members.iter().any(|&i| samples[i].ce_weights.iter().any(|w| *w != 0.0));
            for i in members {
                let s = &samples[i];
                let n = s.ids.len().min(seq_len);
                row.input_ids.extend_from_slice(&s.ids[..n]);
                row.position_ids.extend(0..n as u32);
                row.seq_lens.push(n as u32);
                row.loss_mask.extend_from_slice(&s.loss_mask[..n]);
                row.advantages.extend_from_slice(&s.advantages[..n]);
                row.inference_logprobs.extend_from_slice(&s.inference_logprobs[..n]);
                row.temperatures.extend_from_slice(&s.temperatures[..n]);
                if any_ce {
                    row.ce_weights.extend_from_slice(&s.ce_weights[..n]);
                }
                row.env_index.extend(std::iter::repeat_n(s.env_index, n));
            }
            row
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithms::Algorithm;

    fn trace(reward: f64, completion: usize) -> pb::Trace {
        pb::Trace {
            reward,
            nodes: vec![
                pb::MessageNode { parent: -1, token_ids: vec![1, 2, 3], mask: vec![false; 3], ..Default::default() },
                pb::MessageNode {
                    parent: 0,
                    sampled: true,
                    token_ids: vec![9; completion],
                    mask: vec![true; completion],
                    logprobs: vec![-0.25; completion],
                    ..Default::default()
                },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn samples_fan_out_the_temperature_and_drop_zero_advantage_groups() {
        let group = [trace(1.0, 2), trace(0.0, 2)];
        let targets =
            crate::algorithms::aggregate(&["grpo"], &group, &[Algorithm::Grpo.local_channels(&group).unwrap()])
                .unwrap();
        let s = samples(&group[0], &targets[0], 0.7, 3, true);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].temperatures, vec![0.7; 5], "every token carries the env's temperature");
        assert_eq!(s[0].loss_mask, vec![false, false, false, true, true]);
        assert_eq!(s[0].inference_logprobs, vec![0.0, 0.0, 0.0, -0.25, -0.25]);
        assert_eq!(s[0].env_index, 3);
        let same = [trace(0.5, 2), trace(0.5, 2)];
        let targets =
            crate::algorithms::aggregate(&["grpo"], &same, &[Algorithm::Grpo.local_channels(&same).unwrap()]).unwrap();
        assert!(samples(&same[0], &targets[0], 1.0, 0, true).is_empty(), "all-zero advantages train nothing");
        let kept = samples(&same[0], &targets[0], 1.0, 0, false);
        assert_eq!(kept.len(), 1, "without the filter a zero-advantage group is still shipped");
        assert_eq!(kept[0].loss_mask, vec![false, false, false, true, true], "and counts in the normaliser");
    }
}
