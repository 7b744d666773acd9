//! Turn-level credit for `grpo` (`credit = "turn"`): in a multi-turn episode whose reward is the
//! mean of per-turn rewards (`Trace.turn_rewards`), the tokens of model turn k get the advantage of
//! the turn's reward-to-go `G_k = (r_k + r_{k+1} + ... ) / n` (so `G_0` is the episode reward),
//! baselined against `G_k` of the same turn in the group's other rollouts. What a turn's tokens
//! could not influence (the earlier turns' rewards) no longer enters their advantage: a correct
//! second answer after a wrong first one is not pushed down with it. `turn_discount` `d` weighs
//! the later turns: `G_k = (r_k + d r_{k+1} + ...) / n`; at 0 each turn is credited with its own
//! reward alone. With `best_of = k`, each turn's returns become max@k weights first (`best_of`).
//! With a greedy rollout as the baseline, turn k is compared with the greedy rollout's `G_k` (the
//! group's mean where the greedy episode has no turn k).

use rl_configs::algorithms::RewardScaling;

use super::group_math::group_advantages;
use super::{Channel, LossChannel};
use crate::error::{Error, Result};
use crate::rollout::Rollout;

/// Discounted reward-to-go of each turn: `G_k = sum_{j >= k} d^(j-k) r_j / n`.
pub(crate) fn rewards_to_go(turns: &[f64], discount: f64) -> Vec<f64> {
    let n = turns.len() as f64;
    let mut out = vec![0.0; turns.len()];
    let mut acc = 0.0;
    for (k, r) in turns.iter().enumerate().rev() {
        acc = r + discount * acc;
        out[k] = acc / n;
    }
    out
}

/// The channels of a group under turn credit. Rollouts with errors, and rollouts whose turn
/// rewards are missing because a reward function failed, get no channel and enter no baseline; a
/// clean rollout without turn rewards and without reward errors means the env does not report
/// them, which is a configuration error.
pub(crate) fn turn_channels(
    group: &[Rollout],
    scale: RewardScaling,
    discount: f64,
    best_of: usize,
    greedy: Option<&Rollout>,
    env: &str,
) -> Result<Vec<Vec<Channel>>> {
    let greedy_returns = greedy.map(|g| rewards_to_go(&g.trace.turn_rewards, discount)).unwrap_or_default();
    let mut returns: Vec<Option<Vec<f64>>> = Vec::with_capacity(group.len());
    for r in group {
        if !r.is_clean() {
            returns.push(None);
            continue;
        }
        if r.trace.turn_rewards.is_empty() {
            if r.trace.reward_errors.is_empty() {
                return Err(Error::Config(format!(
                    "`grpo` with `credit = \"turn\"` needs per-turn rewards, and env `{env}` reported none \
                     (its rubric has no turn reward function); use `credit = \"episode\"` for it"
                )));
            }
            returns.push(None);
            continue;
        }
        returns.push(Some(rewards_to_go(&r.trace.turn_rewards, discount)));
    }
    let turns = returns.iter().flatten().map(Vec::len).max().unwrap_or(0);
    // Each turn's advantages against the same turn of the rollouts that have it.
    let mut advantages: Vec<Vec<f32>> = returns.iter().map(|g| vec![0.0; g.as_ref().map_or(0, Vec::len)]).collect();
    let per_turn = (0..turns).map(|k| -> (Vec<usize>, Vec<f64>) {
        returns.iter().enumerate().filter_map(|(i, g)| Some((i, *g.as_ref()?.get(k)?))).unzip()
    });
    for (k, (who, at_k)) in per_turn.enumerate() {
        let baseline = greedy_returns.get(k).copied();
        for (i, a) in who.into_iter().zip(group_advantages(&at_k, scale, best_of, baseline)) {
            advantages[i][k] = a as f32;
        }
    }
    group
        .iter()
        .zip(&returns)
        .zip(&advantages)
        .map(|((r, g), advantages)| if g.is_some() { branch_channels(r, advantages, env) } else { Ok(vec![]) })
        .collect()
}

/// `advantages[k]` on the sampled tokens of the k-th sampled node of each branch.
fn branch_channels(r: &Rollout, advantages: &[f32], env: &str) -> Result<Vec<Channel>> {
    r.branches
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let mut values = Vec::with_capacity(b.mask.len());
            let mut turn = 0;
            for &n in &b.nodes {
                let node = &r.trace.nodes[n];
                let value = if node.sampled {
                    let Some(a) = advantages.get(turn) else {
                        return Err(Error::Config(format!(
                            "env `{env}`: trace {} has more model turns than its {} turn rewards",
                            r.trace.id,
                            advantages.len()
                        )));
                    };
                    turn += 1;
                    *a
                } else {
                    0.0
                };
                values.extend(node.mask.iter().map(|m| if *m { value } else { 0.0 }));
            }
            Ok(Channel { branch: i, loss: LossChannel::Rl, values, mask: b.mask.clone() })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use rl_serve::pb;

    use super::super::tests::node;
    use super::*;

    /// A two-turn episode: user, reply of 2 tokens, user, reply of 3 tokens.
    fn two_turns(turn_rewards: Vec<f64>) -> Rollout {
        let reward = turn_rewards.iter().sum::<f64>() / turn_rewards.len().max(1) as f64;
        Rollout::new(pb::Trace {
            reward,
            turn_rewards,
            nodes: vec![
                node(-1, "user", 2, false),
                node(0, "assistant", 2, true),
                node(1, "user", 1, false),
                node(2, "assistant", 3, true),
            ],
            ..Default::default()
        })
    }

    #[test]
    fn with_a_greedy_rollout_each_turn_is_compared_with_its_same_turn() {
        // Turn rewards a (1, 0), b (0, 1), discount 0: returns a (0.5, 0), b (0, 0.5). The greedy
        // episode scored (1, 0.5): returns (0.5, 0.25).
        let group = vec![two_turns(vec![1.0, 0.0]), two_turns(vec![0.0, 1.0])];
        let greedy = two_turns(vec![1.0, 0.5]);
        let ch = turn_channels(&group, RewardScaling::None, 0.0, 1, Some(&greedy), "e").unwrap();
        assert_eq!(ch[0][0].values, vec![0.0, 0.0, 0.0, 0.0, 0.0, -0.25, -0.25, -0.25]);
        assert_eq!(ch[1][0].values, vec![0.0, 0.0, -0.5, -0.5, 0.0, 0.25, 0.25, 0.25]);
        // A greedy episode without turn rewards leaves each turn's group mean as the baseline.
        let plain = turn_channels(&group, RewardScaling::None, 0.0, 1, None, "e").unwrap();
        let bare = two_turns(vec![]);
        assert_eq!(turn_channels(&group, RewardScaling::None, 0.0, 1, Some(&bare), "e").unwrap(), plain);
    }

    #[test]
    fn reward_to_go_sums_this_and_later_turns_over_all_turns() {
        assert_eq!(rewards_to_go(&[1.0, 0.0, 0.5], 1.0), vec![0.5, 0.5 / 3.0, 0.5 / 3.0]);
        assert_eq!(rewards_to_go(&[], 1.0), Vec::<f64>::new());
    }

    #[test]
    fn a_discount_weighs_later_turns_less_and_zero_keeps_each_turn_alone() {
        assert_eq!(rewards_to_go(&[1.0, 0.0, 0.5], 0.0), vec![1.0 / 3.0, 0.0, 0.5 / 3.0]);
        assert_eq!(rewards_to_go(&[1.0, 0.0, 0.5], 0.5), vec![(1.0 + 0.125) / 3.0, 0.25 / 3.0, 0.5 / 3.0]);
    }

    #[test]
    fn each_turn_is_baselined_against_the_same_turn_of_the_group() {
        // Turn rewards (first, second): a (1, 0), b (0, 1). Returns-to-go: a (0.5, 0), b (0.5, 0.5).
        let group = vec![two_turns(vec![1.0, 0.0]), two_turns(vec![0.0, 1.0])];
        let ch = turn_channels(&group, RewardScaling::None, 1.0, 1, None, "e").unwrap();
        // Both first turns lead to the same episode reward: advantage 0. Second turns: -0.25, +0.25.
        let expect = |second: f32| vec![0.0, 0.0, 0.0, 0.0, 0.0, second, second, second];
        assert_eq!(ch[0][0].values, expect(-0.25));
        assert_eq!(ch[1][0].values, expect(0.25));
        assert_eq!(ch[0][0].mask, vec![false, false, true, true, false, true, true, true]);
        // Scaled by the turn's std (0.25 for the second turn; 0 for the first).
        let ch = turn_channels(&group, RewardScaling::Group, 1.0, 1, None, "e").unwrap();
        assert!((ch[1][0].values[5] - 0.25 / (0.25 + 1e-4)).abs() < 1e-6);
        assert_eq!(ch[1][0].values[2], 0.0);
    }

    #[test]
    fn episode_and_turn_credit_agree_on_single_turn_episodes() {
        let one = |r: f64| {
            Rollout::new(pb::Trace {
                reward: r,
                turn_rewards: vec![r],
                nodes: vec![node(-1, "user", 2, false), node(0, "assistant", 2, true)],
                ..Default::default()
            })
        };
        let ch = turn_channels(&[one(1.0), one(0.0), one(0.5)], RewardScaling::None, 1.0, 1, None, "e").unwrap();
        let firsts: Vec<f32> = ch.iter().map(|c| c[0].values[2]).collect();
        assert_eq!(firsts, vec![0.5, -0.5, 0.0]);
    }

    #[test]
    fn best_of_k_applies_to_each_turn_separately() {
        // Own-turn credit (discount 0); first turns 1, 0, 0 and second turns 0, 0, 1.
        let group = vec![two_turns(vec![1.0, 0.0]), two_turns(vec![0.0, 0.0]), two_turns(vec![0.0, 1.0])];
        let ch = turn_channels(&group, RewardScaling::None, 0.0, 2, None, "e").unwrap();
        // Per turn, returns 1/2 for the best and 0 for the others; best-of-2 weights 1/2 for the
        // best and 1/4 for the others (one of their two pairs holds the best); the mean is 1/3.
        let (best, other) = (1.0 / 2.0 - 1.0 / 3.0, 1.0 / 4.0 - 1.0 / 3.0);
        let close = |a: f32, b: f64| (f64::from(a) - b).abs() < 1e-6;
        assert!(close(ch[0][0].values[2], best) && close(ch[0][0].values[5], other), "{:?}", ch[0][0].values);
        assert!(close(ch[1][0].values[2], other) && close(ch[1][0].values[5], other));
        assert!(close(ch[2][0].values[2], other) && close(ch[2][0].values[5], best));
    }

    #[test]
    fn rollouts_without_turn_rewards_are_an_error_unless_a_reward_function_failed() {
        let err =
            turn_channels(&[two_turns(vec![]), two_turns(vec![1.0, 0.0])], RewardScaling::None, 1.0, 1, None, "sorter")
                .unwrap_err()
                .to_string();
        assert!(err.contains("sorter") && err.contains("credit = \"episode\""), "{err}");
        let mut failed = two_turns(vec![]);
        failed.trace.reward_errors.push(pb::RewardError { name: String::from("f"), message: String::from("x") });
        let ch = turn_channels(&[failed, two_turns(vec![1.0, 0.0])], RewardScaling::None, 1.0, 1, None, "e").unwrap();
        assert!(ch[0].is_empty());
        // Alone in its baselines, the other rollout's advantages are 0.
        assert!(ch[1][0].values.iter().all(|v| *v == 0.0));
    }

    #[test]
    fn more_model_turns_than_turn_rewards_is_an_error() {
        let err =
            turn_channels(&[two_turns(vec![1.0])], RewardScaling::None, 1.0, 1, None, "e").unwrap_err().to_string();
        assert!(err.contains("more model turns than its 1 turn rewards"), "{err}");
    }
}
