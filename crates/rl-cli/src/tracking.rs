//! Starting and finishing the W&B sidecar (`python -m rl_env.tracking`) for `rl rl` and `rl sft`:
//! the one place that spells its command line.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use rl_configs::{RunDir, WandbConfig};

/// The sidecar's program and arguments for `run`; `single` when the run has one metrics file
/// (`rl sft`), so each row is sent as it arrives instead of merged with the trainer's.
pub(crate) fn command(run: &RunDir, w: &WandbConfig, single: bool) -> Vec<String> {
    let settings = serde_json::json!({
        "project": w.project, "entity": w.entity, "name": w.name, "tags": w.tags, "mode": w.mode,
        "samples_every": w.samples_every, "dir": w.dir.clone().unwrap_or_else(|| run.wandb()),
        "single": single,
    });
    let mut cmd = w.python.clone();
    cmd.extend(["-m", "rl_env.tracking", "--run-dir"].map(String::from));
    cmd.push(run.root().display().to_string());
    cmd.extend([String::from("--settings"), settings.to_string()]);
    cmd
}

/// Starts the sidecar for `rl sft`, logging to `log`.
pub(crate) fn start(run: &RunDir, w: &WandbConfig, log: &Path) -> anyhow::Result<Child> {
    let cmd = command(run, w, true);
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let file = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
    Command::new(&cmd[0])
        .args(&cmd[1..])
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
        .with_context(|| format!("cannot start the W&B sidecar `{}`", cmd[0]))
}

/// Lets the sidecar send the last rows and close its W&B run: SIGTERM, then up to two minutes.
/// Returns whether it ended within that time.
pub(crate) fn finish(child: &mut Child) -> bool {
    if !matches!(child.try_wait(), Ok(None)) {
        return true;
    }
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(120) {
        if let Ok(Some(_)) = child.try_wait() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    false
}
