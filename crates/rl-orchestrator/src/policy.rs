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
    /// The server's `boot_id` when it last held `version`, and when that was checked.
    boot: Option<String>,
    checked: Option<Instant>,
}

/// How often the server's `boot_id` is compared (one `/health` call).
const BOOT_CHECK: Duration = Duration::from_secs(1);

impl PolicyVersion {
    /// Tracks `run`'s broadcasts, the server holding `version`.
    pub(crate) fn new(run: RunDir, version: u64) -> Self {
        PolicyVersion { run, version, boot: None, checked: None }
    }

    /// A server that restarted (new `boot_id`) holds its starting weights: give it the loaded
    /// version again.
    pub(crate) async fn reload_after_restart(&mut self, models: &Models) -> Result<()> {
        if self.checked.is_some_and(|t| t.elapsed() < BOOT_CHECK) {
            return Ok(());
        }
        self.checked = Some(Instant::now());
        let Some(boot) = models.policy_boot_id().await else { return Ok(()) };
        if self.boot.as_ref().is_some_and(|b| *b != boot) && self.version > 0 {
            tracing::warn!(
                version = self.version,
                "the policy's inference server restarted; loading its weights again"
            );
            models.update_weights(&self.run.broadcast(self.version)).await?;
        }
        self.boot = Some(boot);
        Ok(())
    }

    /// The loaded version.
    pub(crate) fn get(&self) -> u64 {
        self.version
    }

    /// Loads every complete broadcast newer than the loaded version, in order.
    pub(crate) async fn load_new(&mut self, models: &Models) -> Result<()> {
        self.reload_after_restart(models).await?;
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
            match self.load_new(models).await {
                Ok(()) => {}
                // The server is down (restarting): keep waiting within the limit.
                Err(e) if start.elapsed() <= limit && !models.policy_reachable().await => {
                    if start.elapsed() >= next_warning {
                        tracing::warn!(error = %e, "the policy's inference server does not answer; waiting");
                    }
                }
                Err(e) => return Err(e),
            }
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
            tokio::time::sleep(rl_configs::run_dir::POLL_INTERVAL).await;
        }
    }
}
