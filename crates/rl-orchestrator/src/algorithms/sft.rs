//! `sft`: imitate the (frozen) actor — ce weight 1 on every sampled token of every clean rollout.

use super::{Algorithm, Channel, EnvInfo, LossChannel, Scoring, on_sampled, single_agent};
use crate::error::Result;
use crate::rollout::Rollout;
use async_trait::async_trait;

/// ce weight 1 on the actor's sampled tokens.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sft;

#[async_trait]
impl Algorithm for Sft {
    fn id(&self) -> &str {
        "sft"
    }

    fn attach(&mut self, env: &EnvInfo) -> Result<()> {
        single_agent(self.id(), env)
    }

    async fn channels(&mut self, group: &[Rollout], _: Scoring<'_>) -> Result<Vec<Vec<Channel>>> {
        Ok(group.iter().map(|r| if r.is_clean() { on_sampled(r, 1.0, LossChannel::Ce) } else { vec![] }).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{local, rollout};
    use super::*;

    #[test]
    fn sft_puts_ce_weight_one_on_the_actor_tokens() {
        let group = [rollout(0.0, 2, false), rollout(1.0, 2, true)];
        let ch = local(&mut Sft, &group);
        assert_eq!(ch[0][0].loss, LossChannel::Ce);
        assert_eq!(ch[0][0].values, vec![0.0, 0.0, 1.0, 1.0]);
        assert!(ch[1].is_empty(), "a failed rollout is not imitated");
    }
}
