//! `echo`: grpo, plus ce weight `alpha` on the observations (messages of the chosen roles that the
//! actor did not sample) after the branch's first sampled turn — the model also learns to predict
//! what tools and users answer. The prompt itself is never trained.

use async_trait::async_trait;
use rl_configs::algorithms::EchoRole;

use super::group_math::{clean_mean, grpo_advantage};
use super::{Algorithm, Channel, EnvInfo, LossChannel, Scoring, on_sampled, single_agent};
use crate::error::Result;
use crate::rollout::Rollout;

/// grpo plus ce weight `alpha` on observation tokens of `roles`.
#[derive(Debug, Clone, PartialEq)]
pub struct Echo {
    alpha: f32,
    roles: Vec<String>,
}

impl Echo {
    /// Echo with ce weight `alpha` on messages of `roles`.
    pub fn new(alpha: f64, roles: &[EchoRole]) -> Self {
        let roles = roles
            .iter()
            .map(|r| match r {
                EchoRole::Tool => String::from("tool"),
                EchoRole::User => String::from("user"),
            })
            .collect();
        Echo { alpha: alpha as f32, roles }
    }

    fn observations(&self, rollout: &Rollout) -> Vec<Channel> {
        let nodes = &rollout.trace.nodes;
        rollout
            .branches
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let mut mask = Vec::with_capacity(b.token_ids.len());
                let mut seen_sampled = false;
                for &n in &b.nodes {
                    let node = &nodes[n];
                    let trained = seen_sampled && !node.sampled && self.roles.contains(&node.role);
                    seen_sampled |= node.sampled;
                    mask.extend(std::iter::repeat_n(trained, node.token_ids.len()));
                }
                let values = mask.iter().map(|m| if *m { self.alpha } else { 0.0 }).collect();
                Channel { branch: i, loss: LossChannel::Ce, values, mask }
            })
            .collect()
    }
}

#[async_trait]
impl Algorithm for Echo {
    fn id(&self) -> &str {
        "echo"
    }

    fn attach(&mut self, env: &EnvInfo) -> Result<()> {
        single_agent(self.id(), env)
    }

    async fn channels(&mut self, group: &[Rollout], _: Scoring<'_>) -> Result<Vec<Vec<Channel>>> {
        let mean = clean_mean(group);
        Ok(group
            .iter()
            .map(|r| {
                if !r.is_clean() {
                    return vec![];
                }
                let mut chans = on_sampled(r, grpo_advantage(r.reward(), mean) as f32, LossChannel::Rl);
                chans.extend(self.observations(r));
                chans
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{local, node, rollout};
    use super::*;
    use rl_serve::pb;

    #[test]
    fn echo_trains_tool_and_user_observations_after_the_first_sampled_turn() {
        // system(1) user(2) assistant(3, sampled) tool(2) user(1) assistant(2, sampled)
        let t = Rollout::new(pb::Trace {
            reward: 1.0,
            nodes: vec![
                node(-1, "system", 1, false),
                node(0, "user", 2, false),
                node(1, "assistant", 3, true),
                node(2, "tool", 2, false),
                node(3, "user", 1, false),
                node(4, "assistant", 2, true),
            ],
            ..Default::default()
        });
        let group = [t, rollout(0.0, 1, false)];
        let ch = local(&mut Echo::new(0.1, &[EchoRole::Tool, EchoRole::User]), &group);
        assert_eq!(ch[0].len(), 2, "one rl and one ce channel for the single branch");
        let (rl, ce) = (&ch[0][0], &ch[0][1]);
        assert_eq!((rl.loss, ce.loss), (LossChannel::Rl, LossChannel::Ce));
        assert_eq!(rl.values, vec![0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.0, 0.0, 0.0, 0.5, 0.5], "grpo: 1 - 0.5");
        // The first user turn is the prompt (before any sampled turn): not trained. The tool result
        // and the later user feedback are.
        assert_eq!(ce.values, vec![0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.1, 0.1, 0.1, 0.0, 0.0]);
        let ce = &local(&mut Echo::new(0.1, &[EchoRole::Tool]), &group)[0][1];
        assert_eq!(ce.values, vec![0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.1, 0.1, 0.0, 0.0, 0.0]);
    }
}
