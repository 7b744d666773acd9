//! The run directory contract: every path under a run's `output_dir`, who writes it and who reads
//! it, in one place. Producers and readers (trainer, orchestrator, launcher, plots) go through
//! [`RunDir`]; nobody spells a run path by hand (the W&B sidecar, in Python, gets its paths from
//! it too). Beside the layout: durable file writes (temp file, fsync, rename; JSONL appends that
//! survive a torn line) and the metric rows of the metrics files. Its own crate, below
//! `rl-configs`, so that the config schema stays a schema and every process reaches the run
//! directory the same way.
//!
//! ```text
//! <run>/.lock                               held by the one `rl rl` / `rl sft` running here
//! <run>/configs/<part>.json                  resolved configs (launcher, dry runs)
//! <run>/logs/<process>.log                   one log per child process (launcher)
//! <run>/metrics.jsonl                        orchestrator step rows, or SFT rows (MetricsRow, SftRow)
//! <run>/trainer/metrics.jsonl                RL trainer step rows (TrainerRow)
//! <run>/curves.svg                           curves drawn from the two files above
//! <run>/rollouts/step_N/rank_0.bin           training batch of step N (orchestrator -> trainer)
//! <run>/rollouts/step_N/traces.jsonl         the step's traces as text (for people)
//! <run>/evals/step_N/traces.jsonl            the evaluation's traces at step N (0: before training, `rl eval`)
//! <run>/broadcasts/step_N/model.safetensors  weights after step N (trainer -> inference)
//! <run>/broadcasts/step_N/STABLE             written last: the broadcast is complete
//! <run>/checkpoints/step_N/trainer/          weights, optimizer, progress.json
//! <run>/checkpoints/step_N/orchestrator/state.json
//! <run>/model/                               the final HF-format model
//! <run>/eval.json                            `rl eval`'s result
//! ```

mod files;
mod lock;
mod metrics;

use std::path::{Path, PathBuf};

pub use files::{
    FileError, Retained, append_jsonl, persist, read_jsonl, repair_jsonl, retain_jsonl, temp_path, write_atomic,
    write_json_atomic,
};
pub use lock::{LOCK_FILE, LockError, RunLock};
pub use metrics::{
    MetricsRow, RolloutMetrics, SftRow, TrainerRow, group_exact_key, group_share_key, group_val_loss_key,
};

/// How often a process waiting for another's file (a batch, a broadcast) looks again. An
/// on-policy step waits for both in turn, so half of this is added to every step twice; a
/// `stat` every 5 ms costs nothing measurable.
pub const POLL_INTERVAL: std::time::Duration = std::time::Duration::from_millis(5);

/// The name of a step's traces file.
const TRACES_FILE: &str = "traces.jsonl";

/// A part of a run with a resolved config under `<run>/configs/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigPart<'a> {
    /// `rl.json`: the whole `rl rl` config.
    Rl,
    /// `sft.json`: an `rl sft` run's config.
    Sft,
    Trainer,
    Orchestrator,
    Inference,
    /// `envs/<split>/<name>.json`: an env server `rl rl` starts.
    EnvServer {
        split: &'a str,
        name: &'a str,
    },
    /// `env-server-<name>.json`: `rl env-server` run on its own.
    EnvServerAlone {
        name: &'a str,
    },
}

/// The run directory of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunDir {
    root: PathBuf,
}

/// `step_N`.
fn step_name(step: impl std::fmt::Display) -> String {
    format!("step_{step}")
}

impl RunDir {
    /// The run directory at `root` (nothing is created).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        RunDir { root: root.into() }
    }

    /// The directory itself.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether a run has left anything here: false for a missing or empty directory and for one
    /// holding only the resolved configs a `--dry-run` wrote (and the lock).
    pub fn has_run_output(&self) -> bool {
        let Ok(entries) = std::fs::read_dir(&self.root) else { return false };
        entries.flatten().any(|e| e.file_name() != "configs" && e.file_name() != LOCK_FILE)
    }

    /// Resolved configs of the run's parts.
    pub fn configs(&self) -> PathBuf {
        self.root.join("configs")
    }

    /// The resolved config of one part, relative to [`RunDir::configs`].
    pub fn config_name(part: ConfigPart<'_>) -> PathBuf {
        match part {
            ConfigPart::Rl => PathBuf::from("rl.json"),
            ConfigPart::Sft => PathBuf::from("sft.json"),
            ConfigPart::Trainer => PathBuf::from("trainer.json"),
            ConfigPart::Orchestrator => PathBuf::from("orchestrator.json"),
            ConfigPart::Inference => PathBuf::from("inference.json"),
            ConfigPart::EnvServer { split, name } => PathBuf::from("envs").join(split).join(format!("{name}.json")),
            ConfigPart::EnvServerAlone { name } => PathBuf::from(format!("env-server-{name}.json")),
        }
    }

    /// The resolved config of one part.
    pub fn config(&self, part: ConfigPart<'_>) -> PathBuf {
        self.configs().join(Self::config_name(part))
    }

    /// Logs of the child processes.
    pub fn logs(&self) -> PathBuf {
        self.root.join("logs")
    }

    /// The log of one process (`/` in names becomes `-`).
    pub fn log(&self, process: &str) -> PathBuf {
        self.logs().join(format!("{}.log", process.replace('/', "-")))
    }

    /// Orchestrator step rows ([`MetricsRow`]), or SFT step rows ([`SftRow`]) in an SFT run.
    pub fn metrics(&self) -> PathBuf {
        self.root.join("metrics.jsonl")
    }

    /// RL trainer step rows ([`TrainerRow`]).
    pub fn trainer_metrics(&self) -> PathBuf {
        self.root.join("trainer").join("metrics.jsonl")
    }

    /// The curves drawn from the metrics.
    pub fn curves(&self) -> PathBuf {
        self.root.join("curves.svg")
    }

    /// TensorBoard event files when `[tensorboard]` sets no `dir`.
    pub fn tensorboard(&self) -> PathBuf {
        self.root.join("tensorboard")
    }

    /// The W&B sidecar's directory when `[wandb]` sets no `dir`.
    pub fn wandb(&self) -> PathBuf {
        self.root.join("wandb")
    }

    /// The final exported model.
    pub fn model(&self) -> PathBuf {
        self.root.join("model")
    }

    /// The final LoRA adapter (PEFT's format), when a run trains adapters.
    pub fn adapter(&self) -> PathBuf {
        self.root.join("adapter")
    }

    /// `rl eval`'s result.
    pub fn eval_result(&self) -> PathBuf {
        self.root.join("eval.json")
    }

    /// Per-step rollout directories.
    pub fn rollouts(&self) -> PathBuf {
        self.root.join("rollouts")
    }

    /// The rollouts of one step.
    pub fn rollout_step(&self, step: u64) -> PathBuf {
        self.rollouts().join(step_name(step))
    }

    /// A step's traces file as a template with `{step}` for the step, for programs that are not
    /// Rust (the tracking sidecar).
    pub fn traces_template(&self) -> String {
        self.rollouts().join(step_name("{step}")).join(TRACES_FILE).display().to_string()
    }

    /// The training batch of one step.
    pub fn batch(&self, step: u64) -> PathBuf {
        self.rollout_step(step).join("rank_0.bin")
    }

    /// The step's traces as text.
    pub fn traces(&self, step: u64) -> PathBuf {
        self.rollout_step(step).join(TRACES_FILE)
    }

    /// Per-step evaluation directories.
    pub fn evals(&self) -> PathBuf {
        self.root.join("evals")
    }

    /// The traces of the evaluation run at `step` (every eval env's, one line per rollout, as
    /// [`RunDir::traces`]); step 0 is the evaluation before training and `rl eval`'s.
    pub fn eval_traces(&self, step: u64) -> PathBuf {
        self.evals().join(step_name(step)).join(TRACES_FILE)
    }

    /// [`RunDir::eval_traces`] as a template with `{step}` for the step (the tracking sidecar).
    pub fn eval_traces_template(&self) -> String {
        self.evals().join(step_name("{step}")).join(TRACES_FILE).display().to_string()
    }

    /// Weight broadcasts.
    pub fn broadcasts(&self) -> PathBuf {
        self.root.join("broadcasts")
    }

    /// The broadcast of the weights after `step` (`step_0`: the starting weights).
    pub fn broadcast(&self, step: u64) -> PathBuf {
        self.broadcasts().join(step_name(step))
    }

    /// The marker written after a broadcast's weights are complete.
    pub fn broadcast_marker(&self, step: u64) -> PathBuf {
        self.broadcast(step).join("STABLE")
    }

    /// Whether the broadcast of `step` is complete.
    pub fn broadcast_complete(&self, step: u64) -> bool {
        self.broadcast_marker(step).exists()
    }

    /// The newest complete broadcast.
    pub fn latest_broadcast(&self) -> Option<(u64, PathBuf)> {
        steps_in(&self.broadcasts()).into_iter().rev().find(|(s, _)| self.broadcast_complete(*s))
    }

    /// Checkpoint directories.
    pub fn checkpoints(&self) -> PathBuf {
        self.root.join("checkpoints")
    }

    /// The checkpoint of one step (trainer and orchestrator parts inside).
    pub fn checkpoint(&self, step: u64) -> PathBuf {
        self.checkpoints().join(step_name(step))
    }

    /// The trainer's part of a checkpoint.
    pub fn trainer_checkpoint(&self, step: u64) -> PathBuf {
        self.checkpoint(step).join("trainer")
    }

    /// The file that marks a trainer checkpoint complete (written inside its temp dir before the
    /// rename).
    pub fn trainer_checkpoint_marker(&self, step: u64) -> PathBuf {
        self.trainer_checkpoint(step).join("progress.json")
    }

    /// The orchestrator's part of a checkpoint.
    pub fn orchestrator_state(&self, step: u64) -> PathBuf {
        self.checkpoint(step).join("orchestrator").join("state.json")
    }

    /// Steps with a checkpoint directory, ascending.
    pub fn checkpoint_steps(&self) -> Vec<u64> {
        steps_in(&self.checkpoints()).into_iter().map(|(s, _)| s).collect()
    }

    /// Steps for which both the trainer and the orchestrator finished a checkpoint, ascending.
    pub fn complete_checkpoints(&self) -> Vec<u64> {
        self.checkpoint_steps()
            .into_iter()
            .filter(|&s| self.trainer_checkpoint_marker(s).exists() && self.orchestrator_state(s).exists())
            .collect()
    }
}

/// `step_N` subdirectories of `dir` with their N, ascending (none when `dir` does not exist).
pub fn steps_in(dir: &Path) -> Vec<(u64, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<(u64, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_str()?.strip_prefix("step_")?.parse().ok()?;
            Some((n, e.path()))
        })
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout users, scripts and older runs rely on (the table in the module docs).
    #[test]
    fn the_layout_is_the_documented_one() {
        let run = RunDir::new("r");
        let rel = |p: PathBuf| p.strip_prefix("r").unwrap().to_str().unwrap().to_owned();
        assert_eq!(rel(run.config(ConfigPart::Trainer)), "configs/trainer.json");
        assert_eq!(rel(run.log("env/a")), "logs/env-a.log");
        assert_eq!(rel(run.metrics()), "metrics.jsonl");
        assert_eq!(rel(run.trainer_metrics()), "trainer/metrics.jsonl");
        assert_eq!(rel(run.curves()), "curves.svg");
        assert_eq!(rel(run.batch(3)), "rollouts/step_3/rank_0.bin");
        assert_eq!(rel(run.traces(3)), "rollouts/step_3/traces.jsonl");
        assert_eq!(run.traces_template().replace("{step}", "3"), run.traces(3).display().to_string());
        assert_eq!(rel(run.broadcast(3).join("model.safetensors")), "broadcasts/step_3/model.safetensors");
        assert_eq!(rel(run.broadcast_marker(3)), "broadcasts/step_3/STABLE");
        assert_eq!(rel(run.trainer_checkpoint_marker(4)), "checkpoints/step_4/trainer/progress.json");
        assert_eq!(rel(run.orchestrator_state(4)), "checkpoints/step_4/orchestrator/state.json");
        assert_eq!(rel(run.model()), "model");
        assert_eq!(rel(run.eval_result()), "eval.json");
        assert_eq!(rel(run.eval_traces(100)), "evals/step_100/traces.jsonl");
        assert_eq!(run.eval_traces_template().replace("{step}", "9"), run.eval_traces(9).display().to_string());
    }

    #[test]
    fn steps_are_listed_in_numeric_order_and_strays_are_ignored() {
        let tmp = std::env::temp_dir().join(format!("rl-rundir-steps-{}", std::process::id()));
        let run = RunDir::new(&tmp);
        for s in [10, 2, 1] {
            std::fs::create_dir_all(run.broadcast(s)).unwrap();
        }
        std::fs::create_dir_all(run.broadcasts().join("step_x")).unwrap();
        std::fs::create_dir_all(run.broadcasts().join("other")).unwrap();
        let steps: Vec<u64> = steps_in(&run.broadcasts()).into_iter().map(|(s, _)| s).collect();
        assert_eq!(steps, vec![1, 2, 10]);
        assert_eq!(run.latest_broadcast(), None, "no broadcast is complete yet");
        std::fs::write(run.broadcast_marker(2), b"").unwrap();
        assert_eq!(run.latest_broadcast().map(|(s, _)| s), Some(2));
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn a_dry_runs_configs_are_not_run_output() {
        let tmp = std::env::temp_dir().join(format!("rl-rundir-output-{}", std::process::id()));
        let run = RunDir::new(&tmp);
        assert!(!run.has_run_output(), "missing");
        std::fs::create_dir_all(run.configs()).unwrap();
        std::fs::write(run.config(ConfigPart::Rl), b"{}").unwrap();
        assert!(!run.has_run_output(), "only a dry run's configs");
        std::fs::write(run.metrics(), b"").unwrap();
        assert!(run.has_run_output());
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn a_checkpoint_is_complete_only_with_both_parts() {
        let tmp = std::env::temp_dir().join(format!("rl-rundir-ckpt-{}", std::process::id()));
        let run = RunDir::new(&tmp);
        for s in [2, 4] {
            std::fs::create_dir_all(run.trainer_checkpoint(s)).unwrap();
            std::fs::write(run.trainer_checkpoint_marker(s), b"{}").unwrap();
        }
        std::fs::create_dir_all(run.orchestrator_state(4).parent().unwrap()).unwrap();
        std::fs::write(run.orchestrator_state(4), b"{}").unwrap();
        assert_eq!(run.checkpoint_steps(), vec![2, 4]);
        assert_eq!(run.complete_checkpoints(), vec![4]);
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
