//! Group-relative advantage math shared by the outcome algorithms (`reward.rs`), per-turn credit
//! (`turns.rs`) and echo: the clean mean, mean and std, and the max@k-weighted advantages.

use rl_configs::algorithms::RewardScaling;

use super::best_of::max_at_k_weights;
use crate::rollout::Rollout;

/// Mean reward of the clean rollouts (0 when there are none).
pub(crate) fn clean_mean(group: &[Rollout]) -> f64 {
    let clean: Vec<f64> = group.iter().filter(|r| r.is_clean()).map(Rollout::reward).collect();
    if clean.is_empty() { 0.0 } else { clean.iter().sum::<f64>() / clean.len() as f64 }
}

/// Mean and population std of `values` (0, 0 for none).
pub(crate) fn mean_std(values: &[f64]) -> (f64, f64) {
    if values.is_empty() {
        return (0.0, 0.0);
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    (mean, (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt())
}

/// Group-relative advantages of `rewards` (one group's, or one turn's across a group): the max@k
/// weights when `best_of > 1`, minus their mean (or minus `baseline`, a greedy rollout's reward),
/// scaled with `Group` scaling by their std (with a baseline: the std of the rewards and it).
pub(crate) fn group_advantages(
    rewards: &[f64],
    scale: RewardScaling,
    best_of: usize,
    baseline: Option<f64>,
) -> Vec<f64> {
    let weights = max_at_k_weights(rewards, best_of);
    let (mean, std) = match baseline {
        None => mean_std(&weights),
        // Samples that all beat (or all trail) the greedy answer by the same margin still differ
        // from it: the spread that scales them includes the reward they are compared with.
        Some(b) => (b, mean_std(&[weights.as_slice(), &[b]].concat()).1),
    };
    let scale = match scale {
        RewardScaling::None => 1.0,
        RewardScaling::Group => 1.0 / (std + 1e-4),
    };
    weights.iter().map(|w| grpo_advantage(*w, mean) * scale).collect()
}

/// The group-relative advantage of a reward (shared with `echo`).
pub(crate) fn grpo_advantage(reward: f64, mean: f64) -> f64 {
    reward - mean
}
