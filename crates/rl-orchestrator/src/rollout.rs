//! The orchestrator's view of a rollout: the env server's trace with its branches computed once
//! (every algorithm, the sink and the metrics read the same branches), and the group it belongs to.

use rl_serve::{Branch, branches, pb};

/// Rewards closer than this count as equal (a group with no spread teaches nothing).
pub(crate) const UNIFORM_SPREAD: f64 = 1e-9;

/// One scored trace and its branches (root-to-leaf token sequences, by leaf index).
#[derive(Debug, Clone, PartialEq)]
pub struct Rollout {
    /// The trace as the env server returned it.
    pub trace: pb::Trace,
    /// Its branches.
    pub branches: Vec<Branch>,
    /// Index of its episode in the group (multi-agent episodes hold several rollouts).
    pub episode: usize,
}

impl Rollout {
    /// A rollout of `trace`, the only one of its episode.
    pub fn new(trace: pb::Trace) -> Self {
        Self::of_episode(0, trace)
    }

    /// A rollout of `trace` in episode `episode` of its group.
    pub fn of_episode(episode: usize, trace: pb::Trace) -> Self {
        let branches = branches(&trace);
        Rollout { trace, branches, episode }
    }

    /// Whether the rollout finished without an error (only clean rollouts are trained and enter
    /// baselines).
    pub fn is_clean(&self) -> bool {
        self.trace.errors.is_empty()
    }

    /// The rollout's total reward.
    pub fn reward(&self) -> f64 {
        self.trace.reward
    }

    /// Scores the rollout as 0 when its last model turn was cut at the completion-token limit
    /// (`orchestrator.zero_truncated_completions`): the reward, and of per-turn rewards the last
    /// (the cut turn's). Returns whether it did.
    pub fn zero_if_truncated(&mut self) -> bool {
        if !self.trace.is_truncated {
            return false;
        }
        self.trace.reward = 0.0;
        if let Some(cut) = self.trace.turn_rewards.last_mut() {
            *cut = 0.0;
        }
        true
    }

    /// Tokens the actor sampled.
    pub fn sampled_tokens(&self) -> usize {
        self.trace.nodes.iter().filter(|n| n.sampled).flat_map(|n| &n.mask).filter(|m| **m).count()
    }

    /// Tokens of every message.
    pub fn total_tokens(&self) -> usize {
        self.trace.nodes.iter().map(|n| n.token_ids.len()).sum()
    }
}

/// The rollouts of one task from one env, sampled with one policy version.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// Index of the env (into the orchestrator's train envs).
    pub env: usize,
    /// The task: index in the env's `train` split.
    pub task: u64,
    /// Policy version loaded when the group was sampled.
    pub policy_version: u64,
    /// The rollouts.
    pub rollouts: Vec<Rollout>,
    /// A greedy rollout of the same task beside the group, for baselines (not trained): present
    /// when an algorithm of the env asked for one and it came back.
    pub greedy: Option<Rollout>,
}

impl Group {
    /// A group from the traces of one `RunGroup` answer (with their episode indices).
    pub fn new(env: usize, task: u64, policy_version: u64, traces: Vec<(usize, pb::Trace)>) -> Self {
        let rollouts = traces.into_iter().map(|(e, t)| Rollout::of_episode(e, t)).collect();
        Group { env, task, policy_version, rollouts, greedy: None }
    }

    /// Zeroes the truncated rollouts (and the greedy one beside the group); see
    /// [`Rollout::zero_if_truncated`].
    pub fn zero_truncated(&mut self) {
        for r in self.rollouts.iter_mut().chain(self.greedy.as_mut()) {
            r.zero_if_truncated();
        }
    }

    /// Whether the group teaches nothing: its clean rollouts (fewer than two count as none) agree
    /// on the reward and on every per-turn reward, so every advantage is zero.
    pub fn is_uniform(&self) -> bool {
        let clean: Vec<&Rollout> = self.rollouts.iter().filter(|r| r.is_clean()).collect();
        let Some((first, rest)) = clean.split_first() else { return true };
        let same = |a: f64, b: f64| (a - b).abs() <= UNIFORM_SPREAD;
        rest.iter().all(|r| {
            same(r.reward(), first.reward())
                && r.trace.turn_rewards.len() == first.trace.turn_rewards.len()
                && r.trace.turn_rewards.iter().zip(&first.trace.turn_rewards).all(|(a, b)| same(*a, *b))
        })
    }

    /// Mean reward of the clean rollouts (`None` when every rollout failed).
    pub fn clean_mean(&self) -> Option<f64> {
        mean_clean_reward(std::slice::from_ref(self))
    }
}

/// Mean reward of the clean rollouts of all `groups`, each rollout weighing the same (`None` when
/// there is none).
pub(crate) fn mean_clean_reward(groups: &[Group]) -> Option<f64> {
    let clean: Vec<f64> =
        groups.iter().flat_map(|g| &g.rollouts).filter(|r| r.is_clean()).map(Rollout::reward).collect();
    (!clean.is_empty()).then(|| clean.iter().sum::<f64>() / clean.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace(reward: f64, turns: &[f64], truncated: bool) -> pb::Trace {
        pb::Trace { reward, turn_rewards: turns.to_vec(), is_truncated: truncated, ..Default::default() }
    }

    #[test]
    fn a_truncated_rollout_scores_zero_and_so_does_its_cut_turn_only() {
        let mut cut = Rollout::new(trace(0.6, &[0.9, 0.3], true));
        assert!(cut.zero_if_truncated());
        assert_eq!(cut.reward(), 0.0);
        assert_eq!(cut.trace.turn_rewards, vec![0.9, 0.0], "the turns before the cut keep their scores");
        let mut whole = Rollout::new(trace(0.6, &[0.9, 0.3], false));
        assert!(!whole.zero_if_truncated());
        assert_eq!((whole.reward(), whole.trace.turn_rewards.clone()), (0.6, vec![0.9, 0.3]));
        let mut single = Rollout::new(trace(0.8, &[], true));
        assert!(single.zero_if_truncated());
        assert_eq!(single.reward(), 0.0);
    }

    #[test]
    fn a_group_is_uniform_when_its_clean_rollouts_agree_on_reward_and_every_turn() {
        let group = |ts: Vec<pb::Trace>| Group::new(0, 0, 0, ts.into_iter().map(|t| (0, t)).collect());
        assert!(group(vec![trace(1.0, &[], false), trace(1.0, &[], false)]).is_uniform());
        assert!(!group(vec![trace(1.0, &[], false), trace(0.5, &[], false)]).is_uniform());
        // Equal totals, different turns: per-turn credit still has advantages.
        assert!(!group(vec![trace(1.0, &[0.2, 0.8], false), trace(1.0, &[0.8, 0.2], false)]).is_uniform());
        let mut failed = trace(0.0, &[], false);
        failed.errors.push(pb::TraceError::default());
        assert!(group(vec![trace(0.7, &[], false), failed]).is_uniform(), "a failed rollout neither trains nor counts");
        assert!(group(vec![]).is_uniform());
    }

    #[test]
    fn a_group_zeroes_its_truncated_rollouts_and_its_greedy_one() {
        let traces = vec![(0, trace(1.0, &[], true)), (0, trace(1.0, &[], false))];
        let mut g = Group::new(0, 3, 0, traces);
        g.greedy = Some(Rollout::new(trace(0.5, &[], true)));
        g.zero_truncated();
        assert_eq!(g.rollouts.iter().map(Rollout::reward).collect::<Vec<_>>(), vec![0.0, 1.0]);
        assert_eq!(g.greedy.as_ref().map(Rollout::reward), Some(0.0));
        assert_eq!(g.clean_mean(), Some(0.5));
    }

    #[test]
    fn the_mean_clean_reward_weighs_every_clean_rollout_of_every_group_alike() {
        let group = |ts: Vec<pb::Trace>| Group::new(0, 0, 0, ts.into_iter().map(|t| (0, t)).collect());
        let mut failed = trace(1.0, &[], false);
        failed.errors.push(pb::TraceError::default());
        let groups = [
            group(vec![trace(1.0, &[], false), trace(1.0, &[], false), trace(1.0, &[], false)]),
            group(vec![trace(0.0, &[], false), failed]),
        ];
        assert_eq!(mean_clean_reward(&groups), Some(0.75), "3 of 4 clean rollouts at 1, not (1 + 0) / 2");
        assert_eq!(mean_clean_reward(&groups[1..]), Some(0.0));
        assert_eq!(mean_clean_reward(&[]), None);
    }
}
