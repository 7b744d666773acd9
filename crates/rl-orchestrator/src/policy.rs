//! The policy's weights as the inference server holds them: which version is loaded, and loading
//! every newer complete broadcast the trainer writes, in order.

use std::time::{Duration, Instant};

use rl_configs::RunDir;

use crate::error::{Error, Result};
use crate::models::Models;

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
    pub(crate) async fn wait_for(&mut self, models: &Models, version: u64, limit: Option<Duration>) -> Result<()> {
        let start = Instant::now();
        loop {
            self.load_new(models).await?;
            if self.version >= version {
                return Ok(());
            }
            if let Some(l) = limit.filter(|l| start.elapsed() > *l) {
                return Err(Error::Checkpoint {
                    path: self.run.broadcast(version).display().to_string(),
                    message: format!("the trainer did not broadcast these weights within {l:?}"),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
