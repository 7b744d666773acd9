//! The children of `rl rl` as one owner holds them: started in order, each exit acted on by its
//! role (a server restarted on its address within `launcher.max_restarts`, the W&B sidecar
//! reported and left, anything else fatal), and stopped newest first — the orchestrator before
//! the trainer, env servers before inference — however the run ends.

use std::io::Write;

use anyhow::bail;
use rl_run::RunDir;

use super::process::{Proc, Role, tail};

/// The run's children, oldest first.
pub(crate) struct Supervisor {
    run: RunDir,
    procs: Vec<Proc>,
    /// Restarts allowed per server (`launcher.max_restarts`); `None`: a command with no restart
    /// budget (`rl eval`), whose servers' exits are final.
    max_restarts: Option<u32>,
}

impl Supervisor {
    pub(crate) fn new(run: RunDir, max_restarts: u32) -> Self {
        Supervisor { run, procs: Vec::new(), max_restarts: Some(max_restarts) }
    }

    /// A supervisor that never restarts a child.
    pub(crate) fn without_restarts(run: RunDir) -> Self {
        Supervisor { run, procs: Vec::new(), max_restarts: None }
    }

    /// Takes a started child; it is stopped after every child added before it.
    pub(crate) fn add(&mut self, p: Proc) {
        self.procs.push(p);
    }

    /// Acts on every child that exited since the last call: restarts a server, reports a
    /// best-effort child once; any other failure ends the run with the child's log.
    pub(crate) fn check_children(&mut self, out: &mut impl Write) -> anyhow::Result<()> {
        for p in &mut self.procs {
            let Some(status) = p.exited()? else { continue };
            if status.success() && p.role.finishes_the_run() {
                continue;
            }
            if p.restart(&self.run, out, &format!("exited with {status}"), self.max_restarts.unwrap_or(0))? {
                continue;
            }
            if p.role == Role::Tracking {
                if !p.reported {
                    p.reported = true;
                    let log = p.log.display();
                    writeln!(
                        out,
                        "warning: {} exited with {status}; the run goes on without it. {log}:\n{}",
                        p.name,
                        tail(&p.log, 10)
                    )?;
                }
                continue;
            }
            // A restartable child here has used its whole budget: say so.
            let spent = p
                .restart
                .as_ref()
                .filter(|_| self.max_restarts.is_some())
                .map(|r| format!(" (restarted {} times: launcher.max_restarts spent)", r.done));
            bail!(
                "{} exited with {status}{}; last lines of {}:\n{}",
                p.name,
                spent.unwrap_or_default(),
                p.log.display(),
                tail(&p.log, 20)
            );
        }
        Ok(())
    }

    /// Whether the trainer and the orchestrator both exited successfully.
    pub(crate) fn run_finished(&mut self) -> bool {
        let mut finishing = self.procs.iter_mut().filter(|p| p.role.finishes_the_run()).peekable();
        finishing.peek().is_some() && finishing.all(|p| matches!(p.child.try_wait(), Ok(Some(s)) if s.success()))
    }

    /// Looks at every child and the inference servers' health (name, `host:port`).
    pub(crate) fn look(
        &self,
        watch: &mut crate::liveness::Watch,
        inference: &[(String, String)],
    ) -> crate::liveness::Report {
        let children: Vec<crate::liveness::Child<'_>> =
            self.procs.iter().map(|p| crate::liveness::Child { name: &p.name, pid: p.child.id() }).collect();
        watch.look(&children, inference)
    }

    /// The last lines of the logs of `names` (or of the two newest children when none is named).
    pub(crate) fn logs_of(&self, names: &[String]) -> String {
        let named: Vec<&Proc> = self.procs.iter().filter(|p| names.contains(&p.name)).collect();
        let shown = if named.is_empty() { self.procs.iter().rev().take(2).collect() } else { named };
        let logs: Vec<String> =
            shown.iter().map(|p| format!("last lines of {}:\n{}", p.log.display(), tail(&p.log, 20))).collect();
        logs.join("\n")
    }

    /// Lets the tracking sidecar send the last steps before everything is stopped.
    pub(crate) fn finish_tracking(&mut self, out: &mut impl Write) -> anyhow::Result<()> {
        let Some(p) = self.procs.iter_mut().find(|p| p.role == Role::Tracking) else { return Ok(()) };
        if matches!(p.child.try_wait(), Ok(None)) {
            writeln!(out, "waiting for {} to send the last steps (log {})", p.name, p.log.display())?;
            crate::tracking::finish(&mut p.child);
        }
        Ok(())
    }
}

impl Drop for Supervisor {
    /// Stops children newest first.
    fn drop(&mut self) {
        while let Some(p) = self.procs.pop() {
            drop(p);
        }
    }
}
