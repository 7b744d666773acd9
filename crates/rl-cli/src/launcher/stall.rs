//! When no step finishes: after a while the launcher says what each child is doing (stopped by a
//! signal, CPU used since the last look, each inference server's `/health`), and after
//! `launcher.stall_timeout_s` it stops the run naming who cannot be making progress, with logs.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::bail;
use rl_run::RunDir;

use super::supervisor::Supervisor;

/// How long without a finished step before the launcher says what each child is doing (and
/// again as often).
const STALL_NOTICE: Duration = Duration::from_secs(120);

pub(crate) struct Stall {
    /// No step for this long stops the run.
    timeout: Duration,
    /// The launched inference servers (name, `host:port`), for their `/health`.
    inference: Vec<(String, String)>,
    watch: crate::liveness::Watch,
    /// When the last step line (or the start) was printed, and when we last said we are waiting.
    progressed: Instant,
    nagged: Instant,
}

impl Stall {
    pub(crate) fn new(timeout: Duration, inference: Vec<(String, String)>) -> Self {
        let now = Instant::now();
        Stall { timeout, inference, watch: crate::liveness::Watch::default(), progressed: now, nagged: now }
    }

    /// Called once per loop with whether a step finished; fails the run past the timeout.
    pub(crate) fn check(
        &mut self,
        stepped: bool,
        waiting_for: u64,
        sup: &Supervisor,
        run: &RunDir,
        out: &mut impl Write,
    ) -> anyhow::Result<()> {
        if stepped {
            self.progressed = Instant::now();
        } else if self.progressed.elapsed() >= self.timeout {
            let report = sup.look(&mut self.watch, &self.inference);
            bail!(
                "no step finished in {:.0}s (launcher.stall_timeout_s), waiting for step {waiting_for}; stopping the \
                 run (--resume continues from the latest checkpoint).\n{}\n{}",
                self.progressed.elapsed().as_secs_f64(),
                report.lines.join("\n"),
                sup.logs_of(&report.suspects)
            );
        } else if self.progressed.elapsed().min(self.nagged.elapsed()) >= STALL_NOTICE.min(self.timeout / 2) {
            // A stopped or stuck process must not look like a slow step: say what each one does.
            let report = sup.look(&mut self.watch, &self.inference);
            writeln!(
                out,
                "no step finished in the last {:.0}s (waiting for step {waiting_for}; the run stops after {:.0}s); logs \
                 in {}:\n  {}",
                self.progressed.elapsed().as_secs_f64(),
                self.timeout.as_secs_f64(),
                run.logs().display(),
                report.lines.join("\n  ")
            )?;
            self.nagged = Instant::now();
        }
        Ok(())
    }
}
