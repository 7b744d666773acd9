//! The policy's weights as the inference server holds them: which version is loaded, and loading
//! every newer complete broadcast the trainer writes, in order.

use std::time::{Duration, Instant};

use rl_configs::RunDir;

use crate::error::{Error, Result};
use crate::models::Models;

/// How often a wait for the trainer's weights says it is still waiting.
const WAIT_WARNING: Duration = Duration::from_secs(60);

/// The version loaded in the policy's inference server (the trainer step whose weights it serves;
/// 0: the starting weights).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PolicyVersion {
    run: RunDir,
    version: u64,
}

impl PolicyVersion {
    /// Tracks `run`'s broadcasts, the server holding `version`.
    pub(crate) fn new(run: RunDir, version: u64) -> Self {
        PolicyVersion { run, version }
    }

    /// The loaded version.
    pub(crate) fn get(&self) -> u64 {
        self.version
    }

    /// Loads every complete broadcast newer than the loaded version, in order.
    pub(crate) async fn load_new(&mut self, models: &Models) -> Result<()> {
        while self.run.broadcast_complete(self.version + 1) {
            models.update_weights(&self.run.broadcast(self.version + 1)).await?;
            self.version += 1;
            tracing::info!(version = self.version, "policy weights updated");
        }
        Ok(())
    }

    /// Loads broadcasts until the version is at least `version`, waiting at most `limit`.
    pub(crate) async fn wait_for(&mut self, models: &Models, version: u64, limit: Duration) -> Result<()> {
        let start = Instant::now();
        let mut next_warning = WAIT_WARNING;
        loop {
            self.load_new(models).await?;
            if self.version >= version {
                return Ok(());
            }
            if start.elapsed() > limit {
                return Err(Error::Checkpoint {
                    path: self.run.broadcast(version).display().to_string(),
                    message: format!(
                        "the trainer did not broadcast these weights within {:.0}s (is it running? see its log)",
                        limit.as_secs_f64()
                    ),
                });
            }
            // Never silent: a stopped or stuck trainer shows up in the log while we wait.
            if start.elapsed() >= next_warning {
                tracing::warn!(
                    waited_s = start.elapsed().as_secs(),
                    "still waiting for the trainer's weights after step {version} ({}); is the trainer running?",
                    self.run.broadcast(version).display()
                );
                next_warning += WAIT_WARNING;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
