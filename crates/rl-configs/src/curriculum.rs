//! `[orchestrator.train.env.curriculum]`: which of an env's tasks a step trains on. Uniform by
//! default; `difficulty_pool` (prime-rl's `DifficultyPoolSampler`) weights each task by the pool
//! its latest group-mean reward falls in, so solved and hopeless tasks are drawn less often.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{ConfigError, Result};

/// How an env's training tasks are drawn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum CurriculumConfig {
    /// Every task equally likely, with replacement.
    Uniform {},
    /// Each task's weight is the weight of the pool its latest group-mean reward falls in (tasks
    /// not seen yet: `unseen_weight`). Pools are checked in order; a task belongs to the first whose
    /// `threshold` is at least its mean reward, and the last pool takes everything above.
    DifficultyPool {
        /// The pools, by increasing `threshold` (default: hard <= 0.25 at 0.2, normal <= 0.75 at
        /// 1.0, easy at 0.2).
        #[serde(default = "default_pools")]
        pools: Vec<DifficultyPool>,
        /// Weight of tasks never drawn yet.
        #[serde(default = "one")]
        unseen_weight: f64,
    },
}

/// One pool of a difficulty curriculum.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DifficultyPool {
    /// Name in metrics (`curriculum/<env>/pool/<name>`).
    pub name: String,
    /// Highest group-mean reward in this pool (inclusive).
    pub threshold: f64,
    /// Sampling weight of each task in the pool (0: never drawn again).
    pub weight: f64,
}

fn one() -> f64 {
    1.0
}

fn default_pools() -> Vec<DifficultyPool> {
    let pool = |name: &str, threshold: f64, weight: f64| DifficultyPool { name: name.to_owned(), threshold, weight };
    vec![pool("hard", 0.25, 0.2), pool("normal", 0.75, 1.0), pool("easy", 1.0, 0.2)]
}

impl Default for CurriculumConfig {
    fn default() -> Self {
        CurriculumConfig::Uniform {}
    }
}

impl CurriculumConfig {
    /// Checks the pools; `key` is the dotted path of this section.
    pub fn validate(&self, key: &str) -> Result<()> {
        let CurriculumConfig::DifficultyPool { pools, unseen_weight } = self else { return Ok(()) };
        let weight_ok = |w: f64| w.is_finite() && w >= 0.0;
        if !weight_ok(*unseen_weight) {
            return Err(ConfigError::invalid(
                format!("{key}.unseen_weight"),
                format!("must be >= 0, got {unseen_weight}"),
            ));
        }
        if pools.is_empty() {
            return Err(ConfigError::invalid(format!("{key}.pools"), "needs at least one pool"));
        }
        for (i, p) in pools.iter().enumerate() {
            let pk = format!("{key}.pools.{i}");
            if p.name.trim().is_empty() || pools[..i].iter().any(|q| q.name == p.name) {
                return Err(ConfigError::invalid(format!("{pk}.name"), "must be non-empty and unique"));
            }
            if !weight_ok(p.weight) {
                return Err(ConfigError::invalid(format!("{pk}.weight"), format!("must be >= 0, got {}", p.weight)));
            }
            if !p.threshold.is_finite() || (i > 0 && p.threshold <= pools[i - 1].threshold) {
                return Err(ConfigError::invalid(
                    format!("{pk}.threshold"),
                    format!("thresholds must be finite and increasing, got {}", p.threshold),
                ));
            }
        }
        if *unseen_weight == 0.0 {
            return Err(ConfigError::invalid(
                format!("{key}.unseen_weight"),
                "must be > 0: with 0 no task is ever drawn a first time",
            ));
        }
        Ok(())
    }
}
