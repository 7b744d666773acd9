//! `[launcher]`: how `rl rl` supervises its processes (stall timeout, restarts, embedded inference
//! servers).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{ConfigError, Result};

/// `[launcher]`: how `rl rl` supervises its processes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct LauncherConfig {
    /// The launcher stops the run when no step has finished for this many seconds, naming the
    /// children that cannot be making progress (stopped, an unhealthy inference server) with their
    /// logs' last lines. Every two minutes before that it reports what each child is doing.
    pub stall_timeout_s: f64,
    /// The launcher restarts a crashed env server or inference server on its port up to this many
    /// times each (backoff 1, 2, 4 ... s); the orchestrator reconnects, and groups that failed
    /// meanwhile are run again or dropped. The trainer or the orchestrator dying stops the run.
    pub max_restarts: u32,
    /// How many copies of the embedded `[inference]` server to start (the first on
    /// `inference.port`, the others on free ports). The orchestrator spreads groups over them,
    /// least loaded first, and loads every step's weights into each; one that dies is taken out
    /// of service and comes back with the current weights once restarted.
    pub inference_servers: usize,
}

/// The most embedded inference servers one launcher starts.
const MAX_INFERENCE_SERVERS: usize = 16;

impl Default for LauncherConfig {
    fn default() -> Self {
        LauncherConfig { stall_timeout_s: 3600.0, max_restarts: 3, inference_servers: 1 }
    }
}

impl LauncherConfig {
    /// Checks ranges; `key` is the dotted path of this section.
    pub fn validate(&self, key: &str) -> Result<()> {
        crate::shared::seconds(&format!("{key}.stall_timeout_s"), self.stall_timeout_s)?;
        if !(1..=MAX_INFERENCE_SERVERS).contains(&self.inference_servers) {
            return Err(ConfigError::invalid(
                format!("{key}.inference_servers"),
                format!("must be between 1 and {MAX_INFERENCE_SERVERS}, got {}", self.inference_servers),
            ));
        }
        Ok(())
    }
}
