//! One child process of `rl rl`: its role, how it is spawned (own process group, log file, the
//! listening event read from stdout), how it is stopped (TERM to its group, KILL after 10 s), and
//! how a crashed server is started again on its address.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rl_run::RunDir;

/// What a child is to the run: decides its log name, whether it may be restarted, whether its
/// failure is fatal and where it stands in the stop order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Role {
    /// An embedded inference server (`index` of `count`).
    Inference {
        index: usize,
        count: usize,
    },
    /// An env server (`split`: `train` or `eval`).
    EnvServer {
        split: &'static str,
        name: String,
    },
    Trainer,
    Orchestrator,
    /// The W&B sidecar: best effort, its failure is reported and the run goes on.
    Tracking,
}

impl Role {
    /// Its name in messages and its log file's (`<run>/logs/<name>.log`).
    pub(crate) fn name(&self) -> String {
        match self {
            Role::Inference { count: 1, .. } => String::from("inference"),
            Role::Inference { index, .. } => format!("inference-{index}"),
            Role::EnvServer { split: "train", name } => format!("env-{name}"),
            Role::EnvServer { split, name } => format!("env-{split}-{name}"),
            Role::Trainer => String::from("trainer"),
            Role::Orchestrator => String::from("orchestrator"),
            Role::Tracking => String::from("wandb"),
        }
    }

    /// The run is done when both of these exited successfully.
    pub(crate) fn finishes_the_run(&self) -> bool {
        matches!(self, Role::Trainer | Role::Orchestrator)
    }
}

/// A running child; dropping it stops it.
pub(crate) struct Proc {
    pub(crate) role: Role,
    pub(crate) name: String,
    pub(crate) child: Child,
    pub(crate) log: PathBuf,
    /// How to start it again after a crash (servers), and how often it was.
    pub(crate) restart: Option<Restart>,
    /// A best-effort child's failure was already reported.
    pub(crate) reported: bool,
}

/// A server's command line on the port it reported, so a restart keeps its address (the
/// orchestrator's channels reconnect by themselves).
pub(crate) struct Restart {
    program: Option<Vec<String>>,
    args: Vec<String>,
    pub(crate) done: u32,
    /// Crashes in a row, each soon after the (re)start before it: the backoff grows with them.
    quick: u32,
    started: Instant,
}

impl Restart {
    /// Restarts run `program args` (our own binary when `program` is `None`).
    pub(crate) fn new(program: Option<Vec<String>>, args: Vec<String>) -> Self {
        Restart { program, args, done: 0, quick: 0, started: Instant::now() }
    }
}

/// A server that ran this long before crashing is restarted after the shortest backoff again:
/// the backoff is for crash loops, not for the occasional crash of a long run.
pub(crate) const HEALTHY_RUN: Duration = Duration::from_secs(60);

impl Drop for Proc {
    /// SIGTERM to the child's process group (it leads its own: anything it started, a Python
    /// worker or the binary behind a `cargo run` command, goes too), SIGKILL after 10 s.
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let signal = |sig: &str| {
            let _ = Command::new("kill").args([sig, "--", &group]).stderr(Stdio::null()).status();
        };
        if let Ok(None) = self.child.try_wait() {
            signal("-TERM");
            // A stopped child handles TERM only once continued.
            signal("-CONT");
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(10) {
                if let Ok(Some(_)) = self.child.try_wait() {
                    // Whatever it started must not outlive it (the group id cannot have been
                    // reused yet: the group's members keep it).
                    signal("-KILL");
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            signal("-KILL");
            let _ = self.child.wait();
        }
    }
}

/// The last `n` lines of a log.
pub(crate) fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The run's `[env_vars]`, set for every child (restarted ones too); fixed before the first spawn.
static CHILD_ENV: OnceLock<Vec<(String, String)>> = OnceLock::new();

/// Sets the variables every child of this launcher gets (once, before any child starts).
pub(crate) fn set_child_env(vars: &std::collections::BTreeMap<String, String>) {
    let _ = CHILD_ENV.set(vars.iter().map(|(k, v)| (k.clone(), v.clone())).collect());
}

/// Spawns `rl <args>` (or `program <args>`) logging to `<run>/logs/<name>.log`; with `wait_line`,
/// returns the first stdout line (the server's `listening` event) and forwards the rest of stdout
/// to the log.
pub(crate) fn spawn(
    run: &RunDir,
    role: Role,
    program: Option<&[String]>,
    args: &[&str],
    wait_line: bool,
) -> anyhow::Result<(Proc, Option<serde_json::Value>)> {
    let name = role.name();
    let (child, log, event) = spawn_child(run, &name, program, args, wait_line)?;
    Ok((Proc { role, name, child, log, restart: None, reported: false }, event))
}

/// [`spawn`] without the `Proc` (whose drop stops the child): the child, its log and its event.
fn spawn_child(
    run: &RunDir,
    name: &str,
    program: Option<&[String]>,
    args: &[&str],
    wait_line: bool,
) -> anyhow::Result<(Child, PathBuf, Option<serde_json::Value>)> {
    std::fs::create_dir_all(run.logs())?;
    let log = run.log(name);
    // Appending keeps the log of an interrupted run when it is resumed.
    let err_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .with_context(|| format!("cannot create {}", log.display()))?;
    let mut cmd = match program {
        Some([exe, first_args @ ..]) => {
            let mut cmd = Command::new(exe);
            cmd.args(first_args);
            cmd
        }
        _ => {
            let mut cmd = Command::new(std::env::current_exe().context("cannot find the rl executable")?);
            // Our own children exit if the launcher dies without stopping them (see orphan.rs).
            cmd.env(crate::orphan::LAUNCHER_PID, std::process::id().to_string());
            cmd
        }
    };
    cmd.envs(CHILD_ENV.get().into_iter().flatten().map(|(k, v)| (k, v)));
    // Own process group: a terminal Ctrl-C reaches the launcher, which stops children in order.
    cmd.args(args).stderr(err_file.try_clone()?).stdin(Stdio::null()).process_group(0);
    cmd.stdout(if wait_line { Stdio::piped() } else { Stdio::from(err_file) });
    let mut child = cmd.spawn().with_context(|| match program {
        Some(p) => format!("cannot start {name}: `{}`", p.join(" ")),
        None => format!("cannot start {name}"),
    })?;
    let mut event = None;
    if wait_line {
        let stdout = child.stdout.take().context("the child's stdout is not piped")?;
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        reader.read_line(&mut line)?;
        if line.trim().is_empty() {
            let _ = child.wait();
            bail!("{name} exited before reporting its address; last lines of {}:\n{}", log.display(), tail(&log, 20));
        }
        event = Some(
            serde_json::from_str(&line)
                .with_context(|| format!("{name} printed {line:?} instead of its listening event"))?,
        );
        let mut log_file = std::fs::OpenOptions::new().append(true).open(&log)?;
        std::thread::spawn(move || {
            for l in reader.lines().map_while(Result::ok) {
                let _ = writeln!(log_file, "{l}");
            }
        });
    }
    Ok((child, log, event))
}

/// The length of the streak of crashes this one belongs to, given the streak before it and how
/// long the process ran: a crash after [`HEALTHY_RUN`] starts a new streak.
fn quick_crashes(before: u32, ran: Duration) -> u32 {
    if ran >= HEALTHY_RUN { 1 } else { before + 1 }
}

/// The pause before a restart, the `streak`-th crash in a row: 1, 2, 4 ... 32 s.
fn restart_backoff(streak: u32) -> Duration {
    Duration::from_secs(1 << streak.saturating_sub(1).min(5))
}

impl Proc {
    /// Whether it exited, and how (`None`: still running).
    pub(crate) fn exited(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        Ok(self.child.try_wait()?)
    }

    /// Starts a crashed server again on its address, after a backoff (1, 2, 4 s ... for crashes
    /// in quick succession; 1 s again after a run of [`HEALTHY_RUN`]), unless it has no restart
    /// command or `budget` restarts were spent. What the dead process started (its process group)
    /// is killed first.
    pub(crate) fn restart(
        &mut self,
        run: &RunDir,
        out: &mut impl Write,
        why: &str,
        budget: u32,
    ) -> anyhow::Result<bool> {
        let Some(r) = self.restart.as_mut().filter(|r| r.done < budget) else { return Ok(false) };
        r.done += 1;
        r.quick = quick_crashes(r.quick, r.started.elapsed());
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).stderr(Stdio::null()).status();
        writeln!(
            out,
            "{} {why}; restarting it ({}/{budget}) on its address; log {}",
            self.name,
            r.done,
            self.log.display()
        )?;
        std::thread::sleep(restart_backoff(r.quick));
        let args: Vec<&str> = r.args.iter().map(String::as_str).collect();
        let (child, _, _) = spawn_child(run, &self.name, r.program.as_deref(), &args, true)
            .with_context(|| format!("cannot restart {}", self.name))?;
        self.child = child;
        r.started = Instant::now();
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Role;

    #[test]
    fn restart_backoff_grows_with_crash_loops_and_starts_over_after_a_healthy_run() {
        let mut quick = 0;
        let mut pauses = Vec::new();
        for _ in 0..7 {
            quick = super::quick_crashes(quick, Duration::from_secs(2));
            pauses.push(super::restart_backoff(quick).as_secs());
        }
        assert_eq!(pauses, [1, 2, 4, 8, 16, 32, 32]);
        // A crash after a minute of serving is not part of a loop: the shortest pause again.
        quick = super::quick_crashes(quick, super::HEALTHY_RUN);
        assert_eq!(super::restart_backoff(quick).as_secs(), 1);
    }

    #[test]
    fn roles_name_their_logs() {
        assert_eq!(Role::Inference { index: 0, count: 1 }.name(), "inference");
        assert_eq!(Role::Inference { index: 1, count: 2 }.name(), "inference-1");
        assert_eq!(Role::EnvServer { split: "train", name: String::from("a") }.name(), "env-a");
        assert_eq!(Role::EnvServer { split: "eval", name: String::from("a") }.name(), "env-eval-a");
        assert!(Role::Trainer.finishes_the_run() && !Role::Tracking.finishes_the_run());
    }
}
