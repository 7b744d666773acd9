//! The rounds that fill a step with rollouts: the planned round of `batch_size` rollouts and its
//! refill rounds (`max_refill_rounds`: fresh tasks for the rollouts of uniform groups), or rounds
//! until the rollouts hold `token_batch_size` tokens.

use super::Orchestrator;
use crate::dispatch::Collected;
use crate::error::Result;
use crate::rollout::{Group, mean_clean_reward};

/// What a step's refill rounds did (`orchestrator.max_refill_rounds`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct Refill {
    /// Extra rounds sampled.
    pub(super) rounds: u32,
    /// Their groups that joined the step.
    pub(super) kept: u32,
    /// Their groups left out: uniform, or past the missing rollouts.
    pub(super) discarded: u32,
    /// Mean reward of the planned round's clean rollouts: the sampled reward as without refills
    /// (the step's `reward/mean` covers the kept refills too, which are never uniform, so it
    /// leaves out exactly the solved and hopeless tasks a refill replaced).
    pub(super) planned_reward: Option<f64>,
}

impl Orchestrator {
    /// Samples the step's tasks and runs their groups; with `max_refill_rounds`, replaces the
    /// rollouts of uniform groups with those of fresh tasks. Returns the groups, what dispatch saw
    /// and the refill metrics.
    pub(super) async fn rollouts(&mut self, step: u64) -> Result<(Vec<Group>, Collected, Refill)> {
        let (mut groups, mut collected) = self.round(step, self.cfg.batch_size).await?;
        let mut refill = Refill { planned_reward: mean_clean_reward(&groups), ..Refill::default() };
        let teaching =
            |gs: &[Group]| gs.iter().filter(|g| !g.is_uniform()).map(|g| g.rollouts.len() as u32).sum::<u32>();
        let mut missing = self.cfg.batch_size.saturating_sub(teaching(&groups));
        while missing > 0 && refill.rounds < self.cfg.max_refill_rounds {
            refill.rounds += 1;
            let (extra, seen) = self.round(step, missing).await?;
            collected.absorb(seen);
            for g in extra {
                let size = g.rollouts.len() as u32;
                if g.is_uniform() || missing == 0 {
                    refill.discarded += 1;
                } else {
                    missing = missing.saturating_sub(size);
                    refill.kept += 1;
                    groups.push(g);
                }
            }
        }
        Ok((groups, collected, refill))
    }
}
