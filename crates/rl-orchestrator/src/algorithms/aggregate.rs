//! Summing the algorithms' channels into each branch's training targets: every channel is checked
//! against its branch (length, finiteness), same-loss channels add up, and tokens of messages
//! flagged `parse_error` (quarantined markup) are masked out of every loss.

use super::{Channel, LossChannel};
use crate::error::{Error, Result};
use crate::rollout::Rollout;

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

impl BranchTargets {
    fn zeros(n: usize) -> Self {
        BranchTargets { advantages: vec![0.0; n], rl_mask: vec![false; n], ce_weights: vec![0.0; n] }
    }
}

/// `outputs[a]` is algorithm `ids[a]`'s channels for the group (`outputs[a][t]`: rollout `t`'s).
/// Returns the targets of each rollout's branches.
pub fn aggregate(ids: &[&str], group: &[Rollout], outputs: &[Vec<Vec<Channel>>]) -> Result<Vec<Vec<BranchTargets>>> {
    let mut out: Vec<Vec<BranchTargets>> =
        group.iter().map(|r| r.branches.iter().map(|b| BranchTargets::zeros(b.token_ids.len())).collect()).collect();
    for (a, per_rollout) in outputs.iter().enumerate() {
        let algorithm = || ids.get(a).copied().unwrap_or("?").to_owned();
        for (t, channels) in per_rollout.iter().enumerate() {
            for ch in channels {
                let dims = |tokens: usize| Error::Dimensions {
                    algorithm: algorithm(),
                    trace: t,
                    branch: ch.branch,
                    tokens,
                    values: ch.values.len(),
                    mask: ch.mask.len(),
                };
                let target = out.get_mut(t).and_then(|bs| bs.get_mut(ch.branch)).ok_or_else(|| dims(0))?;
                let n = target.advantages.len();
                if ch.values.len() != n || ch.mask.len() != n {
                    return Err(dims(n));
                }
                if ch.values.iter().any(|v| !v.is_finite()) {
                    return Err(Error::NonFinite { algorithm: algorithm(), trace: t, branch: ch.branch });
                }
                for i in (0..n).filter(|&i| ch.mask[i]) {
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
    for (rollout, targets) in group.iter().zip(&mut out) {
        for (b, target) in rollout.branches.iter().zip(targets) {
            let mut at = 0;
            for &n in &b.nodes {
                let node = &rollout.trace.nodes[n];
                let len = node.token_ids.len();
                if node.parse_error {
                    for i in at..at + len {
                        target.rl_mask[i] = false;
                        target.advantages[i] = 0.0;
                        target.ce_weights[i] = 0.0;
                    }
                }
                at += len;
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{local, node, rollout};
    use super::super::{Grpo, Rl};
    use super::*;
    use rl_serve::pb;

    #[test]
    fn same_loss_channels_sum_and_bad_dimensions_are_errors() {
        let group = [rollout(1.0, 2, false), rollout(0.0, 2, false)];
        let grpo = local(&mut Grpo::default(), &group);
        let rl = local(&mut Rl, &group);
        let ce = vec![
            vec![Channel {
                branch: 0,
                loss: LossChannel::Ce,
                values: vec![0.3; 4],
                mask: vec![true, true, false, false],
            }],
            vec![],
        ];
        let agg = aggregate(&["grpo", "rl", "echo"], &group, &[grpo.clone(), rl, ce]).unwrap();
        assert_eq!(agg[0][0].advantages, vec![0.0, 0.0, 1.5, 1.5], "grpo 0.5 + rl 1.0");
        assert_eq!(agg[0][0].ce_weights, vec![0.3, 0.3, 0.0, 0.0]);
        assert_eq!(agg[1][0].advantages, vec![0.0, 0.0, -0.5, -0.5]);
        let bad =
            vec![vec![Channel { branch: 0, loss: LossChannel::Rl, values: vec![1.0; 3], mask: vec![true; 3] }], vec![]];
        let err = aggregate(&["grpo", "broken"], &group, &[grpo.clone(), bad]).unwrap_err();
        assert!(err.to_string().contains("`broken`") && err.to_string().contains("4 tokens"), "{err}");
        let no_branch =
            vec![vec![Channel { branch: 3, loss: LossChannel::Rl, values: vec![1.0; 4], mask: vec![true; 4] }], vec![]];
        assert!(aggregate(&["grpo", "broken"], &group, &[grpo.clone(), no_branch]).is_err());
        let nan = vec![
            vec![Channel { branch: 0, loss: LossChannel::Rl, values: vec![f32::NAN; 4], mask: vec![true; 4] }],
            vec![],
        ];
        assert!(aggregate(&["grpo", "nan"], &group, &[grpo, nan]).unwrap_err().to_string().contains("non-finite"));
    }

    #[test]
    fn parse_error_messages_are_masked_out_of_every_loss() {
        let mut t = rollout(1.0, 2, false).trace;
        t.nodes.push(pb::MessageNode { parse_error: true, ..node(1, "assistant", 2, true) });
        let group = [Rollout::new(t), rollout(0.0, 4, false)];
        let agg = aggregate(&["grpo"], &group, &[local(&mut Grpo::default(), &group)]).unwrap();
        assert_eq!(agg[0][0].rl_mask, vec![false, false, true, true, false, false]);
    }
}
