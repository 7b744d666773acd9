//! The train sink: scored traces become training samples (one per branch: its tokens, the loss
//! mask on trained tokens, inference logprobs, the env's sampling temperature fanned out over every
//! token), and samples are packed first-fit-decreasing into rows of at most `seq_len` tokens.

use rl_configs::Temperature;
use rl_proto::train::v1::MicroBatch;

use crate::algorithms::BranchTargets;
use crate::rollout::Rollout;

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

/// The samples of one rollout (branches with nothing to train are dropped). With `filter_zero`
/// (`orchestrator.filter_zero_advantages`), zero-advantage rl tokens are dropped from the loss mask:
/// they carry no gradient but would dilute the token normaliser. Without it they stay in the mask
/// and count towards it (a group whose advantages are all zero still trains, with no gradient).
pub fn samples(
    rollout: &Rollout,
    targets: &[BranchTargets],
    temperature: Temperature,
    env_index: u32,
    filter_zero: bool,
) -> Vec<TrainingSample> {
    rollout
        .branches
        .iter()
        .zip(targets)
        .filter_map(|(b, t)| {
            let n = b.token_ids.len();
            let loss_mask: Vec<bool> =
                (0..n).map(|i| t.rl_mask[i] && (!filter_zero || t.advantages[i] != 0.0)).collect();
            let s = TrainingSample {
                ids: b.token_ids.clone(),
                loss_mask,
                advantages: t.advantages.clone(),
                inference_logprobs: b.logprobs.clone(),
                // Per-token f32 from here on: the batch and the kernels.
                temperatures: vec![temperature.logprob_divisor(); n],
                ce_weights: t.ce_weights.clone(),
                env_index,
            };
            (s.trained_tokens() > 0).then_some(s)
        })
        .collect()
}

/// Tokens before the sample's first trained token: context only, identical across the samples of
/// a group that share a prompt.
fn context_len(s: &TrainingSample) -> usize {
    s.loss_mask.iter().zip(&s.ce_weights).position(|(m, w)| *m || *w != 0.0).unwrap_or(s.ids.len())
}

/// What one packing unit holds: an optional shared prefix (its first `len` tokens of `sample`),
/// then pieces of samples (`sample`, token range).
#[derive(Debug)]
struct Unit {
    prefix: Option<(usize, usize)>,
    pieces: Vec<(usize, std::ops::Range<usize>)>,
    len: usize,
}

/// Groups samples that share their context (prompt) into units of one prefix and several
/// continuations, each at most `seq_len` tokens; other samples are units of their own (a longer
/// sample is truncated to `seq_len`).
fn units(samples: &[TrainingSample], seq_len: usize) -> Vec<Unit> {
    let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
    let mut by_context: std::collections::HashMap<&[u32], usize> = std::collections::HashMap::new();
    let mut out = Vec::new();
    for (i, s) in samples.iter().enumerate() {
        if s.ids.is_empty() {
            continue;
        }
        let ctx = context_len(s);
        if ctx == 0 || ctx >= s.ids.len() || ctx >= seq_len {
            out.push(Unit {
                prefix: None,
                pieces: vec![(i, 0..s.ids.len().min(seq_len))],
                len: s.ids.len().min(seq_len),
            });
            continue;
        }
        match by_context.entry(&s.ids[..ctx]) {
            std::collections::hash_map::Entry::Occupied(e) => groups[*e.get()].1.push(i),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(groups.len());
                groups.push((ctx, vec![i]));
            }
        }
    }
    for (ctx, members) in groups {
        if let [only] = members[..] {
            let n = samples[only].ids.len().min(seq_len);
            out.push(Unit { prefix: None, pieces: vec![(only, 0..n)], len: n });
            continue;
        }
        let mut unit = Unit { prefix: Some((members[0], ctx)), pieces: Vec::new(), len: ctx };
        for i in members {
            let end = samples[i].ids.len().min(seq_len);
            let piece = end - ctx;
            if unit.len + piece > seq_len {
                out.push(std::mem::replace(&mut unit, Unit { prefix: Some((i, ctx)), pieces: Vec::new(), len: ctx }));
            }
            unit.pieces.push((i, ctx..end));
            unit.len += piece;
        }
        out.push(unit);
    }
    out
}

/// Packs samples first-fit-decreasing into rows of at most `seq_len` tokens. Samples that share
/// their context (the tokens before their first trained token, e.g. a GRPO group's prompt) are
/// packed as that context once, followed by each sample's remainder with the context as parent
/// (see `parents` in the batch protocol): the trainer reads the prompt once per row instead of
/// once per sample, and computes the same logprobs, loss and gradients. Other samples are packed
/// whole (truncated to `seq_len`), positions restarting at 0.
pub fn pack(samples: &[TrainingSample], seq_len: usize) -> Vec<MicroBatch> {
    let mut units = units(samples, seq_len);
    units.sort_by_key(|u| std::cmp::Reverse(u.len));
    let mut bins: Vec<(usize, Vec<Unit>)> = Vec::new();
    for u in units {
        match bins.iter_mut().find(|(used, _)| used + u.len <= seq_len) {
            Some((used, members)) => {
                *used += u.len;
                members.push(u);
            }
            None => bins.push((u.len, vec![u])),
        }
    }
    bins.into_iter().map(|(_, members)| row(samples, &members)).collect()
}

fn row(samples: &[TrainingSample], units: &[Unit]) -> MicroBatch {
    let mut row = MicroBatch::default();
    let any_ce = units.iter().flat_map(|u| &u.pieces).any(|(i, _)| samples[*i].ce_weights.iter().any(|w| *w != 0.0));
    let shared = units.iter().any(|u| u.prefix.is_some());
    let push = |row: &mut MicroBatch, s: &TrainingSample, r: std::ops::Range<usize>, trained: bool, parent: i32| {
        let n = r.len();
        row.input_ids.extend_from_slice(&s.ids[r.clone()]);
        row.position_ids.extend(r.start as u32..r.end as u32);
        row.seq_lens.push(n as u32);
        if trained {
            row.loss_mask.extend_from_slice(&s.loss_mask[r.clone()]);
            row.advantages.extend_from_slice(&s.advantages[r.clone()]);
        } else {
            row.loss_mask.extend(std::iter::repeat_n(false, n));
            row.advantages.extend(std::iter::repeat_n(0.0, n));
        }
        row.inference_logprobs.extend_from_slice(&s.inference_logprobs[r.clone()]);
        row.temperatures.extend_from_slice(&s.temperatures[r.clone()]);
        if any_ce {
            if trained {
                row.ce_weights.extend_from_slice(&s.ce_weights[r]);
            } else {
                row.ce_weights.extend(std::iter::repeat_n(0.0, n));
            }
        }
        row.env_index.extend(std::iter::repeat_n(s.env_index, n));
        if shared {
            row.parents.push(parent);
        }
    };
    for u in units {
        let parent = match u.prefix {
            Some((i, ctx)) => {
                push(&mut row, &samples[i], 0..ctx, false, -1);
                (row.seq_lens.len() - 1) as i32
            }
            None => -1,
        };
        for (i, r) in &u.pieces {
            push(&mut row, &samples[*i], r.clone(), true, parent);
        }
    }
    row
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithms::tests::{local, rollout};
    use crate::algorithms::{Grpo, aggregate};

    #[test]
    fn samples_fan_out_the_temperature_and_drop_zero_advantage_groups() {
        let group = [rollout(1.0, 2, false), rollout(0.0, 2, false)];
        let targets = aggregate(&["grpo"], &group, &[local(&mut Grpo::default(), &group)]).unwrap();
        let s = samples(&group[0], &targets[0], Temperature::new(0.7).unwrap(), 3, true);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].temperatures, vec![0.7; 4], "every token carries the env's temperature");
        assert_eq!(s[0].loss_mask, vec![false, false, true, true]);
        assert_eq!(s[0].inference_logprobs, vec![0.0, 0.0, -0.5, -0.5]);
        assert_eq!(s[0].env_index, 3);
        let same = [rollout(0.5, 2, false), rollout(0.5, 2, false)];
        let targets = aggregate(&["grpo"], &same, &[local(&mut Grpo::default(), &same)]).unwrap();
        assert!(
            samples(&same[0], &targets[0], Temperature::ONE, 0, true).is_empty(),
            "all-zero advantages train nothing"
        );
        let kept = samples(&same[0], &targets[0], Temperature::ONE, 0, false);
        assert_eq!(kept.len(), 1, "without the filter a zero-advantage group is still shipped");
        assert_eq!(kept[0].loss_mask, vec![false, false, true, true], "and counts in the normaliser");
    }
}
