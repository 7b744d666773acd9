//! The orchestrator's view of a rollout: the env server's trace with its branches computed once
//! (every algorithm, the sink and the metrics read the same branches), and the group it belongs to.

use rl_serve::{Branch, branches, pb};

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

    /// Mean reward of the clean rollouts (`None` when every rollout failed).
    pub fn clean_mean(&self) -> Option<f64> {
        let clean: Vec<f64> = self.rollouts.iter().filter(|r| r.is_clean()).map(Rollout::reward).collect();
        (!clean.is_empty()).then(|| clean.iter().sum::<f64>() / clean.len() as f64)
    }
}
