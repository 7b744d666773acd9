//! Python virtual environments that xtask makes from PyPI on demand (benchmark references, the
//! CUDA toolchain wheels, the SDK's and verifiers' tests), each remembered by a marker listing
//! what was installed; `ci` makes them in the background while cargo compiles.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, bail};

/// A venv at `dir` holding `packages` (pip requirement strings); `purpose` names it in messages.
pub(crate) struct Venv {
    pub(crate) dir: PathBuf,
    pub(crate) packages: Vec<String>,
    pub(crate) purpose: &'static str,
}

impl Venv {
    /// Its interpreter, the venv made and filled the first time or whenever the list changes.
    pub(crate) fn ensure(&self) -> anyhow::Result<PathBuf> {
        self.install(None, &AtomicBool::new(false))
    }

    fn python(&self) -> PathBuf {
        self.dir.join("bin/python")
    }

    fn is_ready(&self) -> bool {
        let marker = self.dir.join(".installed");
        std::fs::read_to_string(marker).is_ok_and(|have| have == self.packages.join("\n"))
    }

    /// Installs unless ready; with `log`, pip's output goes there instead of the terminal, and
    /// `cancel` stops pip midway (the marker is then not written, so the next call installs again).
    fn install(&self, log: Option<&File>, cancel: &AtomicBool) -> anyhow::Result<PathBuf> {
        let python = self.python();
        if self.is_ready() {
            return Ok(python);
        }
        let (dir, purpose) = (&self.dir, self.purpose);
        crate::workspace::eprintln_flush(&format!(
            "xtask: installing {purpose} into {} from PyPI{}: {}",
            dir.display(),
            if log.is_some() { " in the background" } else { "" },
            self.packages.join(" ")
        ));
        if !python.exists() {
            let mut venv = Command::new("python3");
            venv.arg("-m").arg("venv").arg(dir);
            let status = run(venv, log, cancel).context("cannot run python3 -m venv")?;
            if !status.success() {
                bail!("python3 -m venv {} failed ({status})", dir.display());
            }
        }
        let mut pip = Command::new(&python);
        // `--no-compile`: pip's bytecode for every installed file (~28,000 of them, torch's and
        // transformers' mostly never imported here) is minutes of CPU that, in `ci`, takes cores
        // from cargo; the interpreters `command` starts write what they import, once.
        pip.args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile"])
            .args(&self.packages);
        let status = run(pip, log, cancel).context("cannot run pip")?;
        if !status.success() {
            bail!(
                "pip install {} failed ({status}): {purpose} comes from PyPI, is it reachable?",
                self.packages.join(" ")
            );
        }
        // Written whole or not at all: a marker names a venv that is complete.
        let (marker, tmp) = (dir.join(".installed"), dir.join(".installed.tmp"));
        std::fs::write(&tmp, self.packages.join("\n")).with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, &marker).with_context(|| format!("cannot write {}", marker.display()))?;
        Ok(python)
    }
}

/// A command running `python`, a venv's interpreter (or the one `RL_BENCH_PYTHON` names). It
/// writes the bytecode of what it imports even where PYTHONDONTWRITEBYTECODE is set (as on these
/// machines): the venvs are installed without any (`--no-compile`), and otherwise every
/// interpreter, e.g. each of the dozens of processes a verifiers test starts, would compile what
/// it imports from source again.
pub(crate) fn command(python: &Path) -> Command {
    let mut cmd = Command::new(python);
    cmd.env_remove("PYTHONDONTWRITEBYTECODE");
    cmd
}

/// Runs `cmd` to its end, its output to `log` when given, killing it if `cancel` is set.
fn run(mut cmd: Command, log: Option<&File>, cancel: &AtomicBool) -> anyhow::Result<std::process::ExitStatus> {
    if let Some(log) = log {
        cmd.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log.try_clone()?);
    }
    let mut child = cmd.spawn()?;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if cancel.load(Ordering::Relaxed) {
            let _ = child.kill();
            let status = child.wait()?;
            bail!("stopped ({status})");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Venvs being made on a thread of their own. Purely a head start: a step calls `Venv::ensure` as
/// it would without it, which finds the venv made, or, where the background install failed,
/// installs again in the foreground and reports the error there. Dropped unfinished (an earlier
/// step failed), it stops pip rather than leave it running after xtask exits.
pub(crate) struct Prefetch {
    thread: Option<JoinHandle<()>>,
    cancel: Arc<AtomicBool>,
}

impl Prefetch {
    /// Starts installing `venvs` one after another; pip's output goes to `target/venv-prefetch.log`.
    pub(crate) fn start(venvs: Vec<Venv>) -> Self {
        let cancel = Arc::new(AtomicBool::new(false));
        let stop = Arc::clone(&cancel);
        let log_path = crate::workspace::project_root().join("target/venv-prefetch.log");
        let thread = std::thread::spawn(move || {
            let log = match open_log(&log_path) {
                Ok(f) => f,
                Err(e) => return crate::workspace::eprintln_flush(&format!("xtask: no venv head start: {e:#}")),
            };
            for venv in &venvs {
                if let Err(e) = venv.install(Some(&log), &stop) {
                    // The step that needs it installs again in the foreground and says why.
                    crate::workspace::eprintln_flush(&format!(
                        "xtask: background install of {} failed ({e:#}); see {}",
                        venv.purpose,
                        log_path.display()
                    ));
                }
            }
        });
        Prefetch { thread: Some(thread), cancel }
    }

    /// Waits for the background installs to end (so no two pips fill one venv at once).
    pub(crate) fn wait(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.cancel.store(true, Ordering::Relaxed);
            let _ = t.join();
        }
    }
}

fn open_log(path: &Path) -> anyhow::Result<File> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    File::create(path).with_context(|| format!("cannot create {}", path.display()))
}
