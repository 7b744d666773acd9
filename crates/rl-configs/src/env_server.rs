//! `EnvServerConfig`: one gRPC environment server process.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{ConfigError, Result};
use crate::shared::{LogConfig, ServeConfig, Table};

/// One environment server: which env it hosts and its serving limits.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct EnvServerConfig {
    /// The environment hosted.
    pub env: EnvSpec,
    /// Bind address and limits.
    pub serve: ServeConfig,
    /// Directory for dry-run output and logs.
    pub output_dir: PathBuf,
    /// Logging.
    pub log: LogConfig,
}

/// An environment id with its arguments.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct EnvSpec {
    /// Environment id (e.g. `reverse-text`).
    pub id: String,
    /// Name used in logs and metrics (default: the id).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Environment arguments.
    pub args: Table,
}

impl EnvServerConfig {
    /// Checks the env id and the serving limits; `key` is the dotted path of this section.
    pub fn validate(&self, key: &str) -> Result<()> {
        let k = |s: &str| if key.is_empty() { s.to_owned() } else { format!("{key}.{s}") };
        if self.env.id.trim().is_empty() {
            return Err(ConfigError::invalid(k("env.id"), "must name an environment (e.g. `reverse-text`)"));
        }
        // The name (or id) becomes a file name: `env-server-<name>.json` in the output directory.
        match &self.env.name {
            Some(name) => crate::shared::plain_name(&k("env.name"), name)?,
            None => crate::shared::plain_name(&k("env.id"), &self.env.id)?,
        }
        self.serve.validate(&k("serve"))
    }
}
