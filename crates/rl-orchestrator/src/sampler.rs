//! Which tasks a step trains on: envs picked by ratio, examples from each env's `train` split by
//! its curriculum, from one seeded generator whose state checkpoints carry (a resumed run samples
//! the same tasks as an uninterrupted one).

use rl_configs::SplitMix64;

use crate::curriculum::Curriculum;

/// One group to run: an env (index into the train envs) and an example of its `train` split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Planned {
    /// The env.
    pub env: usize,
    /// The example index.
    pub index: u64,
}

/// The task sampler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sampler(SplitMix64);

/// What the sampler needs to know about an env.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EnvShape<'a> {
    /// Share of the groups.
    pub ratio: f64,
    /// Rollouts per group.
    pub group_size: u32,
    /// How its tasks are drawn.
    pub curriculum: &'a Curriculum,
}

impl Sampler {
    /// The sampler of a run with `seed`.
    pub fn new(seed: u64) -> Self {
        Sampler(SplitMix64::new(seed ^ 0x6a09_e667_f3bc_c909))
    }

    /// A sampler continuing from a checkpointed state.
    pub fn restore(state: u64) -> Self {
        Sampler(SplitMix64::new(state))
    }

    /// The state to checkpoint.
    pub fn state(&self) -> u64 {
        self.0.state()
    }

    fn pick_env(&mut self, envs: &[EnvShape<'_>]) -> usize {
        let total: f64 = envs.iter().map(|e| e.ratio).sum();
        let mut u = self.0.uniform() * total;
        for (i, e) in envs.iter().enumerate() {
            u -= e.ratio;
            if u <= 0.0 {
                return i;
            }
        }
        envs.len() - 1
    }

    /// Groups until they hold at least `rollouts` rollouts.
    pub fn plan(&mut self, envs: &[EnvShape<'_>], rollouts: u32) -> Vec<Planned> {
        let mut plan = Vec::new();
        let mut planned = 0u32;
        while planned < rollouts && !envs.is_empty() {
            let env = self.pick_env(envs);
            let index = envs[env].curriculum.draw(&mut self.0);
            planned += envs[env].group_size.max(1);
            plan.push(Planned { env, index });
        }
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_cover_the_batch_follow_the_ratios_and_resume_exactly() {
        let (ten, five) = (Curriculum::Uniform { size: 10 }, Curriculum::Uniform { size: 5 });
        let envs = [
            EnvShape { ratio: 3.0, group_size: 4, curriculum: &ten },
            EnvShape { ratio: 1.0, group_size: 8, curriculum: &five },
        ];
        let mut s = Sampler::new(7);
        let plan = s.plan(&envs, 64);
        let rollouts: u32 = plan.iter().map(|p| envs[p.env].group_size).sum();
        assert!((64..64 + 8).contains(&rollouts));
        assert!(plan.iter().all(|p| p.index < [10, 5][p.env]));
        let many: Vec<Planned> = (0..200).flat_map(|_| s.plan(&envs, 64)).collect();
        let first = many.iter().filter(|p| p.env == 0).count() as f64 / many.len() as f64;
        assert!((first - 0.75).abs() < 0.05, "env 0 gets 3/4 of the groups, got {first}");
        let mut resumed = Sampler::restore(s.state());
        assert_eq!(resumed.plan(&envs, 64), s.plan(&envs, 64));
    }
}
