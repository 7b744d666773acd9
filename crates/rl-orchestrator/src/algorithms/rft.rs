//! `rft`: rejection-sampling fine-tuning (expert iteration; ReST, RAFT) — cross-entropy on the
//! sampled tokens of each group's best clean rollouts, those above the group's mean reward and at
//! least `min_reward`, so the policy's likeliest answer moves towards its best samples.

use async_trait::async_trait;

use super::group_math::clean_mean;
use super::{Algorithm, Channel, EnvInfo, LossChannel, Scoring, on_sampled, single_agent};
use crate::error::Result;
use crate::rollout::Rollout;

/// ce weight `weight` on the tokens of the `top` best qualifying rollouts of a group.
#[derive(Debug, Clone, Copy)]
pub struct Rft {
    top: usize,
    min_reward: f64,
    weight: f32,
}

impl Rft {
    /// rft imitating up to `top` rollouts a group.
    pub fn new(top: u32, min_reward: f64, weight: f64) -> Self {
        Rft { top: top as usize, min_reward, weight: weight as f32 }
    }

    /// Indices of the rollouts to imitate: clean, reward >= `min_reward` and above the clean mean,
    /// best first (ties: the earlier rollout), at most `top`.
    fn chosen(&self, group: &[Rollout]) -> Vec<usize> {
        let mean = clean_mean(group);
        let mut ok: Vec<usize> = (0..group.len())
            .filter(|&i| group[i].is_clean() && group[i].reward() >= self.min_reward && group[i].reward() > mean)
            .collect();
        ok.sort_by(|&a, &b| group[b].reward().total_cmp(&group[a].reward()).then(a.cmp(&b)));
        ok.truncate(self.top);
        ok
    }
}

#[async_trait]
impl Algorithm for Rft {
    fn id(&self) -> &str {
        "rft"
    }

    fn attach(&mut self, env: &EnvInfo) -> Result<()> {
        single_agent(self.id(), env)
    }

    async fn channels(&mut self, group: &[Rollout], _: Scoring<'_>) -> Result<Vec<Vec<Channel>>> {
        let chosen = self.chosen(group);
        Ok((0..group.len())
            .map(|i| if chosen.contains(&i) { on_sampled(&group[i], self.weight, LossChannel::Ce) } else { vec![] })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{local, rollout};
    use super::*;

    fn imitated(a: &mut Rft, group: &[Rollout]) -> Vec<bool> {
        local(a, group).iter().map(|c| !c.is_empty()).collect()
    }

    #[test]
    fn the_best_rollouts_above_the_mean_are_imitated_with_the_weight() {
        let group = [rollout(0.2, 2, false), rollout(0.9, 3, false), rollout(0.5, 2, false), rollout(0.9, 2, false)];
        let ch = local(&mut Rft::new(1, 0.0, 0.5), &group);
        assert!(ch[0].is_empty() && ch[2].is_empty() && ch[3].is_empty(), "one rollout, the first of the tie");
        assert_eq!(ch[1][0].loss, LossChannel::Ce);
        assert_eq!(ch[1][0].values, vec![0.0, 0.0, 0.5, 0.5, 0.5], "prompt tokens are not trained");
        // Two: both 0.9s; three would add 0.5, which is not above the mean (0.625).
        assert_eq!(imitated(&mut Rft::new(3, 0.0, 1.0), &group), vec![false, true, false, true]);
    }

    #[test]
    fn failed_low_and_uniform_groups_are_not_imitated() {
        let group = [rollout(0.3, 2, false), rollout(1.0, 2, true), rollout(0.6, 2, false)];
        assert_eq!(imitated(&mut Rft::new(2, 0.0, 1.0), &group), vec![false, false, true], "errors are left out");
        assert_eq!(imitated(&mut Rft::new(2, 0.7, 1.0), &group), vec![false, false, false], "below min_reward");
        let same = [rollout(1.0, 2, false), rollout(1.0, 2, false)];
        assert_eq!(imitated(&mut Rft::new(1, 0.0, 1.0), &same), vec![false, false], "nothing above the mean");
    }
}
