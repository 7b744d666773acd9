//! `hierarchical_grpo` for proposer-solver envs: a rollout's baseline is the mean reward of its
//! peers — the group's clean rollouts of the same member, and for members listed in
//! `episode_agents` only those of the same episode (the solvers of one proposed task are compared
//! with each other, not with other tasks' solvers). `A = r - mean(peers)`; alone, `A = 0`.

use std::collections::BTreeMap;

use super::{Algorithm, Channel, EnvInfo, LossChannel, Scoring, on_sampled};
use crate::error::{Error, Result};
use crate::rollout::Rollout;
use async_trait::async_trait;

/// GRPO with per-(member, episode) peer groups.
#[derive(Debug, Clone, PartialEq)]
pub struct HierarchicalGrpo {
    episode_agents: Vec<String>,
}

impl HierarchicalGrpo {
    /// hierarchical_grpo comparing `episode_agents` within their episode.
    pub fn new(episode_agents: &[String]) -> Self {
        HierarchicalGrpo { episode_agents: episode_agents.to_vec() }
    }

    /// The peer key of a rollout: its member, and its episode for episode agents.
    fn key<'a>(&self, r: &'a Rollout) -> (&'a str, Option<usize>) {
        let member = r.trace.member_id.as_str();
        (member, self.episode_agents.iter().any(|a| a == member).then_some(r.episode))
    }
}

#[async_trait]
impl Algorithm for HierarchicalGrpo {
    fn id(&self) -> &str {
        "hierarchical_grpo"
    }

    fn attach(&mut self, env: &EnvInfo) -> Result<()> {
        if !env.is_multi_agent() {
            return Err(Error::Config(format!(
                "`hierarchical_grpo` compares members' rollouts and needs a multi-agent env; `{}` has no members",
                env.name
            )));
        }
        if let Some(a) = self.episode_agents.iter().find(|a| !env.members.contains(a)) {
            return Err(Error::Config(format!(
                "`hierarchical_grpo`: episode agent `{a}` is not a member of env `{}` (members: {})",
                env.name,
                env.members.join(", ")
            )));
        }
        Ok(())
    }

    async fn channels(&mut self, group: &[Rollout], _: Scoring<'_>) -> Result<Vec<Vec<Channel>>> {
        let mut peers: BTreeMap<(&str, Option<usize>), (f64, usize)> = BTreeMap::new();
        for r in group.iter().filter(|r| r.is_clean()) {
            let e = peers.entry(self.key(r)).or_default();
            e.0 += r.reward();
            e.1 += 1;
        }
        Ok(group
            .iter()
            .map(|r| {
                if !r.is_clean() {
                    return vec![];
                }
                let (sum, n) = peers[&self.key(r)];
                let advantage = if n > 1 { r.reward() - sum / n as f64 } else { 0.0 };
                on_sampled(r, advantage as f32, LossChannel::Rl)
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{local, rollout};
    use super::*;

    fn member(episode: usize, member: &str, reward: f64) -> Rollout {
        let mut r = rollout(reward, 1, false);
        r.trace.member_id = member.to_owned();
        r.episode = episode;
        r
    }

    #[test]
    fn solvers_are_compared_within_their_episode_and_proposers_across_the_group() {
        let env = EnvInfo {
            name: String::from("ps"),
            members: vec![String::from("proposer"), String::from("solver")],
            ..EnvInfo::default()
        };
        let mut h = HierarchicalGrpo::new(&[String::from("solver")]);
        h.attach(&env).unwrap();
        let group = [
            member(0, "proposer", 0.2),
            member(0, "solver", 1.0),
            member(0, "solver", 0.0),
            member(1, "proposer", 0.6),
            member(1, "solver", 0.5),
        ];
        let adv: Vec<f32> = local(&mut h, &group).iter().map(|ch| ch[0].values[2]).collect();
        // Proposers: mean 0.4 across episodes. Solvers of episode 0: mean 0.5; episode 1's solver
        // is alone: 0.
        let want = [-0.2f32, 0.5, -0.5, 0.2, 0.0];
        assert!(adv.iter().zip(want).all(|(a, w)| (a - w).abs() < 1e-6), "{adv:?}");
        let single = EnvInfo { name: String::from("rt"), ..EnvInfo::default() };
        assert!(h.attach(&single).is_err());
        let mut unknown = HierarchicalGrpo::new(&[String::from("critic")]);
        assert!(unknown.attach(&env).unwrap_err().to_string().contains("`critic`"));
    }
}
