//! Orchestrator checkpoints: `<run>/checkpoints/step_N/orchestrator/state.json` holds progress,
//! the task sampler's state and stateful algorithms' state (written to a temp file, then renamed).
//! Also the run-directory hygiene of fresh and resumed runs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Version of the state file layout.
const FORMAT: u32 = 1;

/// Everything the orchestrator needs to continue after step `step`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OrchestratorState {
    /// Layout version.
    pub format: u32,
    /// The last step whose batch was written.
    pub step: u64,
    /// The task sampler's generator state.
    pub sampler: u64,
    /// State of stateful algorithms by `<env>/<algorithm>` (e.g. RAE baselines).
    pub algorithms: BTreeMap<String, serde_json::Value>,
}

fn io(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Io { path: path.display().to_string(), message: e.to_string() }
}

/// `<run>/checkpoints/step_N/orchestrator/state.json`.
pub fn state_path(run_dir: &Path, step: u64) -> PathBuf {
    run_dir.join("checkpoints").join(format!("step_{step}")).join("orchestrator").join("state.json")
}

/// Steps with a complete orchestrator checkpoint, ascending.
pub fn checkpoint_steps(run_dir: &Path) -> Vec<u64> {
    let mut steps: Vec<u64> = numbered(&run_dir.join("checkpoints"))
        .into_iter()
        .map(|(s, _)| s)
        .filter(|s| state_path(run_dir, *s).exists())
        .collect();
    steps.sort_unstable();
    steps
}

/// Writes the state atomically; keeps only the newest `keep_last` orchestrator checkpoints.
pub(crate) fn save(run_dir: &Path, state: &OrchestratorState, keep_last: Option<u32>) -> Result<PathBuf> {
    let path = state_path(run_dir, state.step);
    let dir = path.parent().expect("state files live in a directory");
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let tmp = dir.join(format!("state.json.tmp.{}", std::process::id()));
    let text = serde_json::to_string_pretty(state).map_err(|e| io(&tmp, e))?;
    std::fs::write(&tmp, text).map_err(|e| io(&tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| io(&path, e))?;
    if let Some(keep) = keep_last {
        let steps = checkpoint_steps(run_dir);
        for s in &steps[..steps.len().saturating_sub(keep as usize)] {
            let old = state_path(run_dir, *s);
            if let Some(d) = old.parent() {
                std::fs::remove_dir_all(d).map_err(|e| io(d, e))?;
            }
        }
    }
    Ok(path)
}

/// Reads the checkpoint of `step`, or the latest one.
pub(crate) fn load(run_dir: &Path, step: Option<u64>) -> Result<OrchestratorState> {
    let step = match step {
        Some(s) => s,
        None => *checkpoint_steps(run_dir).last().ok_or_else(|| Error::Checkpoint {
            path: run_dir.join("checkpoints").display().to_string(),
            message: String::from("no orchestrator checkpoint to resume from (was [ckpt] set?)"),
        })?,
    };
    let path = state_path(run_dir, step);
    let fail = |message: String| Error::Checkpoint { path: path.display().to_string(), message };
    let text = std::fs::read_to_string(&path).map_err(|e| fail(format!("cannot read: {e}")))?;
    let state: OrchestratorState = serde_json::from_str(&text).map_err(|e| fail(format!("invalid: {e}")))?;
    if state.format != FORMAT {
        return Err(fail(format!("layout version {} is not supported (expected {FORMAT})", state.format)));
    }
    if state.step != step {
        return Err(fail(format!("holds step {} but lives under step_{step}", state.step)));
    }
    Ok(state)
}

impl OrchestratorState {
    /// A state at `step` with the sampler's generator state and algorithm states.
    pub fn new(step: u64, sampler: u64, algorithms: BTreeMap<String, serde_json::Value>) -> Self {
        OrchestratorState { format: FORMAT, step, sampler, algorithms }
    }
}

fn numbered(dir: &Path) -> Vec<(u64, PathBuf)> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter_map(|e| Some((e.file_name().to_str()?.strip_prefix("step_")?.parse().ok()?, e.path())))
                .collect()
        })
        .unwrap_or_default()
}

/// Removes rollouts and broadcasts of steps after `step` (on a fresh run, `step` = 0: everything
/// an earlier run left except the starting weights), and metrics rows after `step`.
pub fn clean_after(run_dir: &Path, step: u64) -> Result<()> {
    for sub in ["rollouts", "broadcasts"] {
        for (n, path) in numbered(&run_dir.join(sub)) {
            if n > step {
                std::fs::remove_dir_all(&path).map_err(|e| io(&path, e))?;
            }
        }
    }
    let metrics = run_dir.join("metrics.jsonl");
    if let Ok(text) = std::fs::read_to_string(&metrics) {
        let kept: String = text
            .lines()
            .filter(|l| {
                serde_json::from_str::<serde_json::Value>(l)
                    .ok()
                    .and_then(|v| v["step"].as_u64())
                    .is_some_and(|s| s <= step)
            })
            .map(|l| format!("{l}\n"))
            .collect();
        let tmp = run_dir.join(format!("metrics.jsonl.tmp.{}", std::process::id()));
        std::fs::write(&tmp, kept).map_err(|e| io(&tmp, e))?;
        std::fs::rename(&tmp, &metrics).map_err(|e| io(&metrics, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips_and_keep_last_prunes_old_ones() {
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path();
        for step in [2, 4, 6] {
            let algos = BTreeMap::from([(String::from("debate/rae"), serde_json::json!({"k": step}))]);
            save(run, &OrchestratorState::new(step, 1000 + step, algos), Some(2)).unwrap();
        }
        assert_eq!(checkpoint_steps(run), vec![4, 6], "keep_last = 2");
        let latest = load(run, None).unwrap();
        assert_eq!((latest.step, latest.sampler), (6, 1006));
        assert_eq!(latest.algorithms["debate/rae"]["k"], 6);
        assert_eq!(load(run, Some(4)).unwrap().sampler, 1004);
        let err = load(run, Some(2)).unwrap_err().to_string();
        assert!(err.contains("step_2") && err.contains("cannot read"), "{err}");
        assert!(
            load(tempfile::tempdir().unwrap().path(), None)
                .unwrap_err()
                .to_string()
                .contains("no orchestrator checkpoint")
        );
    }

    #[test]
    fn clean_after_keeps_earlier_steps_and_their_metrics() {
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path();
        for s in 0..=4 {
            std::fs::create_dir_all(run.join(format!("broadcasts/step_{s}"))).unwrap();
            std::fs::create_dir_all(run.join(format!("rollouts/step_{s}"))).unwrap();
        }
        let rows: String = (1..=4).map(|s| format!("{{\"step\":{s}}}\n")).collect();
        std::fs::write(run.join("metrics.jsonl"), rows).unwrap();
        clean_after(run, 2).unwrap();
        let left = |sub: &str| {
            let mut v: Vec<u64> = numbered(&run.join(sub)).into_iter().map(|(n, _)| n).collect();
            v.sort_unstable();
            v
        };
        assert_eq!(left("broadcasts"), vec![0, 1, 2]);
        assert_eq!(left("rollouts"), vec![0, 1, 2]);
        assert_eq!(std::fs::read_to_string(run.join("metrics.jsonl")).unwrap(), "{\"step\":1}\n{\"step\":2}\n");
        clean_after(run, 0).unwrap();
        assert_eq!(left("broadcasts"), vec![0], "a fresh run keeps only the starting weights");
    }
}
