//! `grpo`'s fields (advantage scaling, baseline, credit, max@k) and their checks.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::fields::AlgorithmFields;
use crate::error::{ConfigError, Result};

/// How `grpo` scales group-relative advantages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RewardScaling {
    /// A = r - mean(r).
    #[default]
    None,
    /// A = (r - mean(r)) / (std(r) + 1e-4): near-identical rewards in a group still make a full-size
    /// signal (and so does their noise).
    Group,
}

/// What `grpo` subtracts from each reward.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Baseline {
    /// The mean reward of the group's clean rollouts.
    #[default]
    Group,
    /// The reward of one extra greedy (temperature 0) rollout of the same task, run beside the group
    /// and not trained (self-critical sequence training, Rennie et al. 2017; ReMax, Li et al.
    /// 2023): only samples that beat the policy's greedy answer are pushed up, and samples worse
    /// than it but above the group mean are pushed down, so the update moves the mode that greedy
    /// decoding returns. With `credit = "turn"` each turn is compared with the greedy rollout's same
    /// turn. Costs one generation per group; a group whose greedy rollout failed falls back to the
    /// group mean. With `scale_rewards = "group"` the std is taken over the samples and the greedy
    /// reward together.
    Greedy,
}

/// Which tokens `grpo` credits with which reward.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Credit {
    /// Every sampled token gets the episode's advantage.
    #[default]
    Episode,
    /// Each model turn's tokens get the advantage of that turn's reward-to-go (the rewards of this
    /// turn and the later ones, divided by the number of turns, as the episode reward is their
    /// mean), against the same turn of the group's other rollouts: a turn is not blamed for an
    /// earlier turn's mistake. Needs an env that reports per-turn rewards (`Trace.turn_rewards`).
    Turn,
}

/// Fields of `grpo`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GrpoConfig {
    /// How advantages are scaled: `none` (A = r - mean) or `group` (A = (r - mean) / (std + 1e-4)).
    #[serde(default)]
    pub scale_rewards: RewardScaling,
    /// Which reward each token is credited with: `episode` (the episode's, on every sampled
    /// token) or `turn` (each model turn's reward-to-go; multi-turn envs reporting per-turn
    /// rewards).
    #[serde(default)]
    pub credit: Credit,
    /// With `credit = "turn"`: how much a turn's advantage counts the later turns' rewards,
    /// `G_k = (r_k + d r_{k+1} + d^2 r_{k+2} + ...) / n`. 1 (the default) is the plain
    /// reward-to-go; 0 credits each turn with its own reward only, for episodes whose turns
    /// are scored independently (less variance, biased where an answer shapes later turns).
    #[serde(default = "default_turn_discount")]
    pub turn_discount: f64,
    /// Optimise the expected best reward of `best_of` samples instead of the mean reward (PKPO's
    /// max@k, Walder & Karkhanis 2025): each reward is replaced by its unbiased max@k gradient
    /// weight before the baseline. A sample is then credited for being the best of the subsets
    /// it is in, so a group's rare best answer gains more and the near-misses beside it are
    /// pushed down less: the policy keeps exploring instead of sharpening onto its current
    /// answer. 1 (the default) is plain grpo; at most the group size.
    #[serde(default = "default_best_of")]
    pub best_of: u32,
    /// With `best_of > 1`: use it for training steps 1..=`best_of_steps` only, then plain grpo
    /// (PKPO's annealing of k: explore with max@k, then sharpen the policy's most likely
    /// answer, which greedy decoding returns). Unset: `best_of` throughout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_of_steps: Option<u64>,
    /// What each reward is compared with: `group` (the group's mean, the default) or `greedy`
    /// (the reward of a greedy rollout of the same task, run beside the group: the update
    /// aims at the answer greedy decoding gives).
    #[serde(default)]
    pub baseline: Baseline,
}

fn default_turn_discount() -> f64 {
    1.0
}

fn default_best_of() -> u32 {
    1
}

impl Default for GrpoConfig {
    fn default() -> Self {
        GrpoConfig {
            scale_rewards: RewardScaling::default(),
            credit: Credit::default(),
            turn_discount: default_turn_discount(),
            best_of: default_best_of(),
            best_of_steps: None,
            baseline: Baseline::default(),
        }
    }
}

impl AlgorithmFields for GrpoConfig {
    fn validate(&self, key: &str) -> Result<()> {
        let GrpoConfig { credit, turn_discount, best_of, best_of_steps, baseline, .. } = self;
        if *best_of == 0 {
            return Err(ConfigError::invalid(format!("{key}.best_of"), "must be at least 1, got 0"));
        }
        if *best_of > 1 && *baseline == Baseline::Greedy {
            return Err(ConfigError::invalid(
                format!("{key}.baseline"),
                "`greedy` compares each reward with the greedy rollout's, and `best_of` replaces the \
                 rewards by max@k weights, which are not comparable with it: use one of the two",
            ));
        }
        if let Some(steps) = best_of_steps {
            if *best_of == 1 {
                return Err(ConfigError::invalid(
                    format!("{key}.best_of_steps"),
                    "limits the steps of `best_of`, which is 1 (plain grpo): set `best_of` above 1",
                ));
            }
            if *steps == 0 {
                return Err(ConfigError::invalid(format!("{key}.best_of_steps"), "must be at least 1, got 0"));
            }
        }
        if !(0.0..=1.0).contains(turn_discount) {
            return Err(ConfigError::invalid(
                format!("{key}.turn_discount"),
                format!("must be in [0, 1], got {turn_discount}"),
            ));
        }
        if *credit == Credit::Episode && *turn_discount != 1.0 {
            return Err(ConfigError::invalid(
                format!("{key}.turn_discount"),
                "discounts turn rewards, so it needs `credit = \"turn\"`",
            ));
        }
        Ok(())
    }

    fn validate_group(&self, key: &str, group: u32, env: &str) -> Result<()> {
        // max@k estimates the best of k samples from one group: k cannot exceed the group.
        if self.best_of > group {
            return Err(ConfigError::invalid(
                format!("{key}.best_of"),
                format!("is {}, above the group size of `{env}` ({group})", self.best_of),
            ));
        }
        Ok(())
    }
}
