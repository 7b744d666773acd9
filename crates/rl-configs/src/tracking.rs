//! `[wandb]`: experiment tracking for `rl rl` through a Weights & Biases sidecar.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{ConfigError, Result};

/// Where W&B sends the run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum WandbMode {
    /// To the W&B server (needs `WANDB_API_KEY` or `wandb login`).
    #[default]
    Online,
    /// To a local offline run directory (`wandb sync` uploads it later).
    Offline,
    /// Nowhere: the sidecar is not started.
    Disabled,
}

/// Weights & Biases tracking: the launcher starts `python -m rl_env.tracking` (the `rl-env`
/// package with its `wandb` extra: `pip install 'rl-env[wandb]'` from `python/rl-env`), which sends
/// every step's orchestrator and trainer metrics, the resolved config and tables of samples.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct WandbConfig {
    /// W&B project (required).
    pub project: String,
    /// W&B entity (team or user; unset: your default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entity: Option<String>,
    /// Run name in W&B (unset: the run's name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// W&B group the run is filed under (unset: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Tags of the W&B run.
    pub tags: Vec<String>,
    /// `online`, `offline` or `disabled`.
    pub mode: WandbMode,
    /// Log a table of samples (prompt, completion, reward) every this many steps, and one of each
    /// evaluation's rollouts with it (0: never).
    pub samples_every: u64,
    /// The Python interpreter (and its first arguments) with `rl_env` and `wandb` installed.
    pub python: Vec<String>,
    /// Directory of W&B's files (unset: `<run dir>/wandb`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dir: Option<PathBuf>,
}

impl Default for WandbConfig {
    fn default() -> Self {
        WandbConfig {
            project: String::new(),
            entity: None,
            name: None,
            group: None,
            tags: Vec::new(),
            mode: WandbMode::Online,
            samples_every: 10,
            python: vec![String::from("python3")],
            dir: None,
        }
    }
}

impl WandbConfig {
    /// Checks the section; `key` is its dotted path.
    pub fn validate(&self, key: &str) -> Result<()> {
        if self.project.trim().is_empty() {
            return Err(ConfigError::invalid(format!("{key}.project"), "is required: the W&B project to log to"));
        }
        if self.python.first().is_none_or(|p| p.trim().is_empty()) {
            return Err(ConfigError::invalid(format!("{key}.python"), "must name a Python interpreter"));
        }
        Ok(())
    }
}

/// `[tensorboard]`: `rl rl` writes every numeric metric of the orchestrator and the trainer as
/// TensorBoard scalars (`tensorboard --logdir <dir>`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TensorboardConfig {
    /// Directory of the event files (unset: `<run dir>/tensorboard`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dir: Option<PathBuf>,
}
