//! `[orchestrator.train]` and `[orchestrator.eval]`: the training and evaluation envs (id, args,
//! the env server that runs them: an address, a custom command or a spawned `rl env-server`),
//! their sampling overrides, group sizes, curricula and eval splits.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::algorithms::AlgorithmConfig;
use crate::curriculum::CurriculumConfig;
use crate::env_entry::env_entry;
use crate::shared::{SamplingConfig, SamplingOverride, ServeConfig, Table};

/// `[orchestrator.train]`: training envs and their shared sampling.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Sampling arguments for every env, unless the env overrides them.
    pub sampling: SamplingConfig,
    /// The training environments.
    pub env: Vec<TrainEnvConfig>,
}

env_entry! {
    /// One training environment.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct TrainEnvConfig {
        /// Rollouts per example for this env (default: `orchestrator.group_size`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub group_size: Option<u32>,
        /// Relative sampling weight among envs.
        #[serde(default = "default_ratio")]
        pub ratio: f64,
        /// Sampling fields that replace the group's `train.sampling` for this env.
        #[serde(default)]
        pub sampling: SamplingOverride,
        /// Algorithms for this env (default: `orchestrator.algorithms`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub algorithms: Option<Vec<AlgorithmConfig>>,
        /// Which tasks are drawn (default: uniform).
        #[serde(default)]
        pub curriculum: CurriculumConfig,
    }
}

fn default_ratio() -> f64 {
    1.0
}

impl TrainEnvConfig {
    /// A training env with defaults for everything but the id.
    pub fn new(id: &str) -> Self {
        TrainEnvConfig {
            id: id.to_owned(),
            name: None,
            args: Table::new(),
            group_size: None,
            ratio: 1.0,
            sampling: SamplingOverride::default(),
            algorithms: None,
            curriculum: CurriculumConfig::default(),
            address: None,
            command: None,
            serve: ServeConfig::default(),
        }
    }
}

/// `[orchestrator.eval]`: online evaluation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct EvalConfig {
    /// Evaluate every this many steps, and after the last step.
    pub interval: u64,
    /// Also evaluate before the first step.
    pub eval_on_start: bool,
    /// Examples per env (unset: the whole split; more than an env's split holds is refused).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_examples: Option<u32>,
    /// Samples per example, for avg@k and pass@k.
    pub k: u32,
    /// Sampling for evaluation (default: greedy-ish temperature 0.0 is not assumed; same as training).
    pub sampling: SamplingOverride,
    /// Evaluation envs.
    pub env: Vec<EvalEnvConfig>,
}

impl Default for EvalConfig {
    fn default() -> Self {
        EvalConfig {
            interval: 10,
            eval_on_start: false,
            num_examples: None,
            k: 1,
            sampling: SamplingOverride::default(),
            env: Vec::new(),
        }
    }
}

env_entry! {
    /// One evaluation environment.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct EvalEnvConfig {
        /// Dataset split to evaluate on.
        #[serde(default = "default_eval_split")]
        pub split: String,
        /// Examples (default: `eval.num_examples`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub num_examples: Option<u32>,
        /// Samples per example (default: `eval.k`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub k: Option<u32>,
        /// Evaluate this env every this many steps (default: `eval.interval`); like every eval
        /// env, it is also evaluated on start (`eval.eval_on_start`) and after the last step. A
        /// large held-out set can then be scored at the ends of a run and a small one along it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub interval: Option<u64>,
        /// Sampling fields that replace the eval sampling for this env.
        #[serde(default)]
        pub sampling: SamplingOverride,
    }
}

fn default_eval_split() -> String {
    String::from("test")
}
