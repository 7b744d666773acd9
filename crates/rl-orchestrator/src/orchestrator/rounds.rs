//! The rounds that fill a step with rollouts: the planned round of `batch_size` rollouts and its
//! refill rounds (`max_refill_rounds`: fresh tasks for the rollouts of uniform groups), or rounds
//! until the rollouts hold `token_batch_size` tokens.

use super::Orchestrator;
use crate::dispatch::Collected;
use crate::error::Result;
use crate::rollout::{Group, mean_clean_reward};

/// Most rounds a step takes to reach `token_batch_size` (each sized to reach it from the tokens a
/// rollout took so far, so one or two unless rollouts come back empty).
const MAX_TOKEN_ROUNDS: u32 = 16;

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
    /// With `token_batch_size`: the tokens of the step's rollouts.
    pub(super) tokens: Option<u64>,
}

impl Orchestrator {
    /// Samples the step's tasks and runs their groups; with `max_refill_rounds`, replaces the
    /// rollouts of uniform groups with those of fresh tasks. Returns the groups, what dispatch saw
    /// and the refill metrics.
    pub(super) async fn rollouts(&mut self, step: u64) -> Result<(Vec<Group>, Collected, Refill)> {
        if let Some(budget) = self.cfg.token_batch_size {
            return self.rollouts_to_tokens(step, budget).await;
        }
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

    /// `token_batch_size`: a round of `batch_size` rollouts, then rounds of as many rollouts as the
    /// missing tokens need at the tokens a rollout of this step took, until the step holds the
    /// budget (the last round may pass it: every group it ran trains).
    async fn rollouts_to_tokens(&mut self, step: u64, budget: u64) -> Result<(Vec<Group>, Collected, Refill)> {
        let (mut groups, mut collected) = self.round(step, self.cfg.batch_size).await?;
        let mut refill = Refill { planned_reward: mean_clean_reward(&groups), ..Refill::default() };
        let mut tokens = tokens_of(&groups);
        while tokens < budget && refill.rounds < MAX_TOKEN_ROUNDS {
            let rollouts: usize = groups.iter().map(|g| g.rollouts.len()).sum();
            let per = tokens as f64 / rollouts.max(1) as f64;
            let want = if per > 0.0 { ((budget - tokens) as f64 / per).ceil() as u32 } else { self.cfg.batch_size };
            let (extra, seen) = self.round(step, want.max(1)).await?;
            collected.absorb(seen);
            refill.rounds += 1;
            refill.kept += extra.len() as u32;
            tokens += tokens_of(&extra);
            groups.extend(extra);
        }
        refill.tokens = Some(tokens);
        Ok((groups, collected, refill))
    }
}

/// The tokens the groups' rollouts train on: every branch's prompt and completion.
fn tokens_of(groups: &[Group]) -> u64 {
    let branch_tokens =
        |g: &Group| -> usize { g.rollouts.iter().flat_map(|r| &r.branches).map(|b| b.token_ids.len()).sum() };
    groups.iter().map(branch_tokens).sum::<usize>() as u64
}
