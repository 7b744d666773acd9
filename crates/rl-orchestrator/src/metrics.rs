//! A step's rollout metrics (`RolloutMetrics`, the row type `RunDir` owns), gathered while the
//! step's groups become training samples.

use std::collections::BTreeMap;

use rl_run::RolloutMetrics;
use serde_json::{Value, json};

use crate::algorithms::BranchTargets;
use crate::rollout::{Rollout, UNIFORM_SPREAD};

/// Summary statistics of a list of values (all 0 for an empty list).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stats {
    /// Mean.
    pub mean: f64,
    /// Population standard deviation.
    pub std: f64,
    /// Minimum.
    pub min: f64,
    /// Maximum.
    pub max: f64,
    /// 10th percentile (nearest rank).
    pub p10: f64,
    /// 90th percentile (nearest rank).
    pub p90: f64,
}

/// The statistics of `v`.
pub fn stats(v: &[f64]) -> Stats {
    if v.is_empty() {
        return Stats::default();
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let std = (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt();
    let mut sorted = v.to_vec();
    sorted.sort_by(f64::total_cmp);
    let q = |p: f64| sorted[((p * (sorted.len() - 1) as f64).round() as usize).min(sorted.len() - 1)];
    Stats { mean, std, min: sorted[0], max: sorted[sorted.len() - 1], p10: q(0.1), p90: q(0.9) }
}

fn min_max(v: &[f64]) -> Option<(f64, f64)> {
    let first = *v.first()?;
    Some(v.iter().fold((first, first), |(lo, hi), &x| (lo.min(x), hi.max(x))))
}

/// Accumulates one step's rollouts.
#[derive(Debug, Default)]
pub(crate) struct StepTally {
    rewards: Vec<f64>,
    /// Per group: its best reward, and 1 when all its rewards are equal.
    group_best: Vec<f64>,
    group_uniform: Vec<f64>,
    advantages: Vec<f64>,
    completion_lens: Vec<f64>,
    truncated: usize,
    prompt_tokens: usize,
    member_rewards: BTreeMap<String, Vec<f64>>,
    /// Per env: `env/<env>/reward`, `env/<env>/reward/<function>` (its unweighted score),
    /// `env/<env>/metric/<name>`, `env/<env>/reward_errors` (rollouts with a failed function);
    /// per group: `env/<env>/reward_group_best`, `env/<env>/groups_uniform`, and with a greedy
    /// baseline `env/<env>/reward_greedy`.
    per_env: BTreeMap<String, Vec<f64>>,
}

impl StepTally {
    /// Counts one rollout of env `env` and its branches' targets.
    pub(crate) fn add(&mut self, env: &str, multi_agent: bool, rollout: &Rollout, targets: &[BranchTargets]) {
        self.rewards.push(rollout.reward());
        if multi_agent {
            self.member_rewards.entry(format!("{env}/{}", rollout.trace.member_id)).or_default().push(rollout.reward());
        }
        let t = &rollout.trace;
        let mut push = |key: String, value: f64| self.per_env.entry(key).or_default().push(value);
        push(format!("env/{env}/reward"), rollout.reward());
        push(format!("env/{env}/reward_errors"), f64::from(u8::from(!t.reward_errors.is_empty())));
        for (name, r) in &t.rewards {
            push(format!("env/{env}/reward/{name}"), r.score);
        }
        for (name, value) in &t.metrics {
            push(format!("env/{env}/metric/{name}"), *value);
        }
        self.truncated += usize::from(rollout.trace.is_truncated);
        let sampled = rollout.sampled_tokens();
        self.completion_lens.push(sampled as f64);
        self.prompt_tokens += rollout.total_tokens() - sampled;
        for b in targets {
            self.advantages
                .extend(b.advantages.iter().zip(&b.rl_mask).filter(|(_, m)| **m).map(|(a, _)| f64::from(*a)));
        }
    }

    /// Counts one group of env `env` (its rollouts' rewards): its best reward and whether all are
    /// equal.
    pub(crate) fn add_group(&mut self, env: &str, rewards: &[f64]) {
        let Some((lo, hi)) = min_max(rewards) else { return };
        let uniform = f64::from(u8::from(hi - lo <= UNIFORM_SPREAD));
        self.group_best.push(hi);
        self.group_uniform.push(uniform);
        self.per_env.entry(format!("env/{env}/reward_group_best")).or_default().push(hi);
        self.per_env.entry(format!("env/{env}/groups_uniform")).or_default().push(uniform);
    }

    /// The reward of a group's greedy rollout (`env/<env>/reward_greedy`): how the policy's mode
    /// does on the training tasks, next to its samples.
    pub(crate) fn add_greedy(&mut self, env: &str, reward: f64) {
        self.per_env.entry(format!("env/{env}/reward_greedy")).or_default().push(reward);
    }

    /// The step's metrics; `fill` sets the fields the tally does not know (counts and times).
    pub(crate) fn finish(self, fill: impl FnOnce(&mut RolloutMetrics)) -> (RolloutMetrics, BTreeMap<String, Value>) {
        let (r, a, c) = (stats(&self.rewards), stats(&self.advantages), stats(&self.completion_lens));
        let abs: Vec<f64> = self.advantages.iter().map(|x| x.abs()).collect();
        let mut m = RolloutMetrics {
            reward_mean: r.mean,
            reward_std: r.std,
            reward_min: r.min,
            reward_max: r.max,
            reward_p10: r.p10,
            reward_p90: r.p90,
            reward_group_best: (!self.group_best.is_empty()).then(|| stats(&self.group_best).mean),
            groups_uniform: (!self.group_uniform.is_empty()).then(|| stats(&self.group_uniform).mean),
            advantage_mean: a.mean,
            advantage_std: a.std,
            advantage_abs_mean: stats(&abs).mean,
            rollouts: self.rewards.len() as u64,
            completion_tokens: self.completion_lens.iter().sum(),
            completion_len_mean: c.mean,
            completion_len_max: c.max,
            prompt_tokens: self.prompt_tokens as u64,
            truncated: self.truncated as f64 / self.rewards.len().max(1) as f64,
            ..RolloutMetrics::default()
        };
        fill(&mut m);
        let mut keyed: BTreeMap<String, Value> = self
            .member_rewards
            .into_iter()
            .map(|(k, v)| (format!("reward/member/{k}"), json!(stats(&v).mean)))
            .collect();
        keyed.extend(self.per_env.into_iter().map(|(k, v)| (k, json!(stats(&v).mean))));
        (m, keyed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_by_hand() {
        let s = stats(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!((s.mean, s.min, s.max), (2.5, 1.0, 4.0));
        assert!((s.std - 1.25f64.sqrt()).abs() < 1e-12);
        assert_eq!(stats(&[]), Stats::default());
    }

    #[test]
    fn groups_give_best_reward_and_uniform_fraction() {
        let mut t = StepTally::default();
        t.add_group("a", &[0.25, 1.0, 0.5]);
        t.add_group("a", &[0.5, 0.5]);
        t.add_group("b", &[0.0, 0.0, 0.0, 0.0]);
        t.add_group("b", &[]);
        let (m, keyed) = t.finish(|_| {});
        let (best, uniform) = (m.reward_group_best.unwrap(), m.groups_uniform.unwrap());
        assert!((best - 0.5).abs() < 1e-12, "{best}");
        assert!((uniform - 2.0 / 3.0).abs() < 1e-12, "{uniform}");
        assert_eq!(keyed["env/a/reward_group_best"], json!(0.75));
        assert_eq!(keyed["env/a/groups_uniform"], json!(0.5));
        assert_eq!(keyed["env/b/reward_group_best"], json!(0.0));
        assert_eq!(keyed["env/b/groups_uniform"], json!(1.0));
        // A spread far below any reward scale still counts as equal; a real one does not.
        let mut t = StepTally::default();
        t.add_group("a", &[0.3, 0.3 + 1e-12]);
        t.add_group("a", &[0.3, 0.3 + 1e-6]);
        assert_eq!(t.finish(|_| {}).0.groups_uniform, Some(0.5));
        // A step without groups has no group figures (rather than zeros).
        let m = StepTally::default().finish(|_| {}).0;
        assert_eq!((m.reward_group_best, m.groups_uniform), (None, None));
    }
}
