//! Advantages from the group's rewards alone, put on every sampled token: `grpo` (r - mean, the
//! Dr. GRPO form prime-rl uses, or scaled by the group's reward std), `max_rl` ((r - m) / m) and
//! `rl` (r). Rollouts with errors get no channel and stay out of the mean. `grpo` can also credit
//! each turn of a multi-turn episode separately (see `turns`), and optimise the best of k samples
//! instead of the mean (see `best_of`), and compare each reward with a greedy rollout's instead of
//! the group mean (`baseline = "greedy"`).

use async_trait::async_trait;
use rl_configs::algorithms::{Baseline, Credit, RewardScaling};

use super::group_math::{clean_mean, group_advantages};
use super::{Algorithm, Channel, EnvInfo, LossChannel, Scoring, on_sampled, single_agent};
use crate::error::Result;
use crate::rollout::Rollout;

/// `advantage(reward, clean mean)` on the sampled tokens of each clean rollout.
fn reward_channels(group: &[Rollout], advantage: impl Fn(f64, f64) -> f64) -> Vec<Vec<Channel>> {
    let mean = clean_mean(group);
    group
        .iter()
        .map(|r| if r.is_clean() { on_sampled(r, advantage(r.reward(), mean) as f32, LossChannel::Rl) } else { vec![] })
        .collect()
}

/// `A = r - mean(r)`, optionally divided by the std of the clean rewards (+ 1e-4, as TRL does);
/// with turn credit, per turn of its reward-to-go; with `best_of = k > 1`, of the max@k weights.
#[derive(Debug, Clone)]
pub struct Grpo {
    scale: RewardScaling,
    credit: Credit,
    /// How much later turns count in a turn's reward-to-go (turn credit).
    discount: f64,
    /// k of the max@k objective (1: the mean reward).
    best_of: usize,
    /// The last step that uses `best_of` (None: every step).
    best_of_steps: Option<u64>,
    /// What each reward is compared with.
    baseline: Baseline,
    /// The env it is attached to (for errors).
    env: String,
}

impl Grpo {
    /// grpo with the given advantage scaling and credit (and the turn credit's discount), optimising
    /// the best of `best_of` samples.
    pub fn new(scale: RewardScaling, credit: Credit, discount: f64, best_of: u32) -> Self {
        Grpo {
            scale,
            credit,
            discount,
            best_of: best_of.max(1) as usize,
            best_of_steps: None,
            baseline: Baseline::Group,
            env: String::new(),
        }
    }

    /// Compares each reward with `baseline` (the group mean by default).
    pub fn with_baseline(mut self, baseline: Baseline) -> Self {
        self.baseline = baseline;
        self
    }

    /// Uses `best_of` up to step `steps` only (None: throughout), plain grpo after it.
    pub fn best_of_until(mut self, steps: Option<u64>) -> Self {
        self.best_of_steps = steps;
        self
    }
}

impl Default for Grpo {
    fn default() -> Self {
        Grpo::new(RewardScaling::None, Credit::Episode, 1.0, 1)
    }
}

/// `A = (r - m) / m` with `m` the clean mean; 0 when `m <= 0`.
#[derive(Debug, Clone, Copy, Default)]
pub struct MaxRl;

/// `A = r`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rl;

#[async_trait]
impl Algorithm for Grpo {
    fn id(&self) -> &str {
        "grpo"
    }

    fn attach(&mut self, env: &EnvInfo) -> Result<()> {
        self.env = env.name.clone();
        single_agent(self.id(), env)
    }

    fn needs_greedy(&self) -> bool {
        self.baseline == Baseline::Greedy
    }

    async fn channels(&mut self, group: &[Rollout], ctx: Scoring<'_>) -> Result<Vec<Vec<Channel>>> {
        let best_of = if self.best_of_steps.is_none_or(|last| ctx.step <= last) { self.best_of } else { 1 };
        // A greedy rollout that failed is no baseline: the group falls back to its mean.
        let greedy = if self.baseline == Baseline::Greedy { ctx.greedy.filter(|g| g.is_clean()) } else { None };
        if self.credit == Credit::Turn {
            return super::turns::turn_channels(group, self.scale, self.discount, best_of, greedy, &self.env);
        }
        let clean: Vec<f64> = group.iter().filter(|r| r.is_clean()).map(Rollout::reward).collect();
        let mut advantages = group_advantages(&clean, self.scale, best_of, greedy.map(Rollout::reward)).into_iter();
        Ok(group
            .iter()
            .map(|r| match r.is_clean().then(|| advantages.next()).flatten() {
                Some(a) => on_sampled(r, a as f32, LossChannel::Rl),
                None => vec![],
            })
            .collect())
    }
}

#[async_trait]
impl Algorithm for MaxRl {
    fn id(&self) -> &str {
        "max_rl"
    }

    fn attach(&mut self, env: &EnvInfo) -> Result<()> {
        single_agent(self.id(), env)
    }

    async fn channels(&mut self, group: &[Rollout], _: Scoring<'_>) -> Result<Vec<Vec<Channel>>> {
        Ok(reward_channels(group, |r, m| if m > 0.0 { (r - m) / m } else { 0.0 }))
    }
}

#[async_trait]
impl Algorithm for Rl {
    fn id(&self) -> &str {
        "rl"
    }

    fn attach(&mut self, env: &EnvInfo) -> Result<()> {
        single_agent(self.id(), env)
    }

    async fn channels(&mut self, group: &[Rollout], _: Scoring<'_>) -> Result<Vec<Vec<Channel>>> {
        Ok(reward_channels(group, |r, _| r))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{local, local_at, rollout};
    use super::*;

    /// The advantage each rollout got (the value on its first sampled token).
    fn advantages(a: &mut dyn Algorithm, group: &[Rollout]) -> Vec<Option<f32>> {
        local(a, group).iter().map(|ch| ch.first().map(|c| c.values[2])).collect()
    }

    #[test]
    fn builtin_advantages_by_hand() {
        let group = [rollout(1.0, 2, false), rollout(0.0, 2, false), rollout(0.5, 2, false), rollout(9.0, 2, true)];
        // Clean rewards 1, 0, 0.5: mean 0.5. The errored rollout gets nothing and is not in the mean.
        assert_eq!(advantages(&mut Grpo::default(), &group), vec![Some(0.5), Some(-0.5), Some(0.0), None]);
        // std of 1, 0, 0.5 is sqrt(1/6): the scaled advantages are +-0.5 / (0.40825 + 1e-4).
        let scaled = advantages(&mut Grpo::new(RewardScaling::Group, Credit::Episode, 1.0, 1), &group);
        let expected = 0.5 / ((1.0f64 / 6.0).sqrt() + 1e-4);
        assert!((f64::from(scaled[0].unwrap()) - expected).abs() < 1e-5, "{scaled:?}");
        assert_eq!((scaled[2], scaled[3]), (Some(0.0), None));
        assert_eq!(advantages(&mut MaxRl, &group), vec![Some(1.0), Some(-1.0), Some(0.0), None]);
        assert_eq!(advantages(&mut Rl, &group), vec![Some(1.0), Some(0.0), Some(0.5), None]);
        let zero = [rollout(0.0, 1, false), rollout(0.0, 1, false)];
        assert_eq!(advantages(&mut MaxRl, &zero), vec![Some(0.0), Some(0.0)], "m <= 0 gives 0");
    }

    #[test]
    fn best_of_k_baselines_the_max_at_k_weights() {
        let group = [rollout(1.0, 2, false), rollout(0.0, 2, false), rollout(0.5, 2, false), rollout(9.0, 2, true)];
        // Best of 2 over the clean 1, 0, 0.5: weights 1, 3/4, 3/4 (see best_of), mean 5/6.
        let a = advantages(&mut Grpo::new(RewardScaling::None, Credit::Episode, 1.0, 2), &group);
        let expect = [1.0 / 6.0, -1.0 / 12.0, -1.0 / 12.0];
        for (got, want) in a.iter().zip(expect) {
            assert!((f64::from(got.unwrap()) - want).abs() < 1e-6, "{a:?}");
        }
        assert_eq!(a[3], None);
        // The near-miss (0.5) is pushed down less than under the mean objective, and the
        // worst sample no more than it: only the group's best moves up.
        let plain = advantages(&mut Grpo::default(), &group);
        assert!(a[2].unwrap() < 0.0 && a[2].unwrap() > -0.1 && plain[2] == Some(0.0));
        assert_eq!(a[1], a[2]);
        // Best of 1 is plain grpo; a group of equal rewards has no advantage at any k.
        assert_eq!(advantages(&mut Grpo::new(RewardScaling::None, Credit::Episode, 1.0, 1), &group), plain);
        let same = [rollout(0.4, 2, false), rollout(0.4, 2, false), rollout(0.4, 2, false)];
        let flat = advantages(&mut Grpo::new(RewardScaling::Group, Credit::Episode, 1.0, 3), &same);
        assert!(flat.iter().all(|a| a.unwrap().abs() < 1e-6), "{flat:?}");
    }

    #[test]
    fn best_of_steps_anneals_to_plain_grpo_after_its_last_step() {
        let group = [rollout(1.0, 2, false), rollout(0.0, 2, false), rollout(0.5, 2, false)];
        let mut annealed = Grpo::new(RewardScaling::None, Credit::Episode, 1.0, 2).best_of_until(Some(10));
        let at =
            |a: &mut Grpo, step| -> Vec<f32> { local_at(a, &group, step).iter().map(|c| c[0].values[2]).collect() };
        let max_at_2 = at(&mut Grpo::new(RewardScaling::None, Credit::Episode, 1.0, 2), 10);
        let plain = at(&mut Grpo::default(), 11);
        assert_ne!(max_at_2, plain);
        assert_eq!(at(&mut annealed, 1), max_at_2);
        assert_eq!(at(&mut annealed, 10), max_at_2);
        assert_eq!(at(&mut annealed, 11), plain);
        // The turn credit follows the same switch.
        let mut turns = Grpo::new(RewardScaling::None, Credit::Turn, 0.0, 2).best_of_until(Some(10));
        let turn_group: Vec<Rollout> = [1.0, 0.0, 0.5]
            .iter()
            .map(|r| {
                let mut x = rollout(*r, 2, false);
                x.trace.turn_rewards = vec![*r];
                x
            })
            .collect();
        let t = |a: &mut Grpo, step| -> Vec<f32> {
            local_at(a, &turn_group, step).iter().map(|c| c[0].values[2]).collect()
        };
        assert_eq!(t(&mut turns, 10), max_at_2);
        assert_eq!(t(&mut turns, 11), plain);
    }

    #[test]
    fn a_greedy_baseline_replaces_the_group_mean_and_a_failed_one_falls_back_to_it() {
        use super::super::tests::local_with;
        let group = [rollout(1.0, 2, false), rollout(0.0, 2, false), rollout(0.5, 2, false), rollout(9.0, 2, true)];
        let mut greedy = Grpo::default().with_baseline(Baseline::Greedy);
        assert!(greedy.needs_greedy() && !Grpo::default().needs_greedy());
        let with = |a: &mut Grpo, g: Option<&Rollout>| -> Vec<Option<f32>> {
            local_with(a, &group, 1, g).iter().map(|ch| ch.first().map(|c| c.values[2])).collect()
        };
        // The greedy answer scored 0.5: only the sample that beat it moves up.
        let half = rollout(0.5, 2, false);
        assert_eq!(with(&mut greedy.clone(), Some(&half)), vec![Some(0.5), Some(-0.5), Some(0.0), None]);
        // It scored 1: the group's best only matches it, the rest are pushed down.
        let best = rollout(1.0, 2, false);
        assert_eq!(with(&mut greedy.clone(), Some(&best)), vec![Some(0.0), Some(-1.0), Some(-0.5), None]);
        // A failed or missing greedy rollout is no baseline: the group mean (0.5) again.
        let plain = with(&mut Grpo::default(), None);
        assert_eq!(with(&mut greedy.clone(), Some(&rollout(1.0, 2, true))), plain);
        assert_eq!(with(&mut greedy, None), plain);
        // The group baseline ignores a greedy rollout it is handed.
        assert_eq!(with(&mut Grpo::default(), Some(&best)), plain);
        // Std scaling over the samples and the greedy reward: 1, 0, 0.5, 1 have std sqrt(11/64).
        let mut scaled = Grpo::new(RewardScaling::Group, Credit::Episode, 1.0, 1).with_baseline(Baseline::Greedy);
        let a = with(&mut scaled, Some(&best));
        let std = (11.0f64 / 64.0).sqrt() + 1e-4;
        assert!((f64::from(a[1].unwrap()) + 1.0 / std).abs() < 1e-5, "{a:?}");
        // Samples that all beat the greedy answer by one margin still get a bounded advantage.
        let same = [rollout(1.0, 2, false), rollout(1.0, 2, false), rollout(1.0, 2, false)];
        let up = local_with(&mut scaled, &same, 1, Some(&half));
        let a = f64::from(up[0][0].values[2]);
        assert!((a - 0.5 / ((3.0f64 / 64.0).sqrt() + 1e-4)).abs() < 1e-4 && a < 3.0, "{a}");
    }

    #[test]
    fn channels_put_the_advantage_on_sampled_tokens_only() {
        let group = [rollout(1.0, 3, false), rollout(0.0, 3, false)];
        let ch = local(&mut Grpo::default(), &group);
        assert_eq!(ch[0][0].values, vec![0.0, 0.0, 0.5, 0.5, 0.5]);
        assert_eq!(ch[0][0].mask, vec![false, false, true, true, true]);
        assert_eq!(ch[1][0].values, vec![0.0, 0.0, -0.5, -0.5, -0.5]);
    }
}
