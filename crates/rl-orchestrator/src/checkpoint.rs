//! Orchestrator checkpoints (`RunDir::orchestrator_state`): progress, the task sampler's state and
//! stateful algorithms' state, written atomically. Also the run-directory hygiene of fresh and
//! resumed runs.

use std::collections::BTreeMap;
use std::path::PathBuf;

use rl_run::RunDir;
use rl_run::{retain_jsonl, steps_in, write_json_atomic};
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
    /// State of stateful curricula by env name (each task's latest group-mean reward).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub curricula: BTreeMap<String, serde_json::Value>,
}

impl OrchestratorState {
    /// A state at `step` with the sampler's generator state and algorithm states.
    pub fn new(step: u64, sampler: u64, algorithms: BTreeMap<String, serde_json::Value>) -> Self {
        OrchestratorState { format: FORMAT, step, sampler, algorithms, curricula: BTreeMap::new() }
    }
}

/// Steps with a complete orchestrator checkpoint, ascending.
pub fn checkpoint_steps(run: &RunDir) -> Vec<u64> {
    run.checkpoint_steps().into_iter().filter(|s| run.orchestrator_state(*s).exists()).collect()
}

/// Writes the state atomically; keeps only the newest `keep_last` orchestrator checkpoints.
pub(crate) fn save(run: &RunDir, state: &OrchestratorState, keep_last: Option<u32>) -> Result<PathBuf> {
    let path = run.orchestrator_state(state.step);
    write_json_atomic(&path, state)?;
    if let Some(keep) = keep_last {
        let steps = checkpoint_steps(run);
        for s in &steps[..steps.len().saturating_sub(keep as usize)] {
            if let Some(d) = run.orchestrator_state(*s).parent() {
                std::fs::remove_dir_all(d).map_err(|e| Error::io(d, &e))?;
            }
        }
    }
    Ok(path)
}

/// Reads the checkpoint of `step`, or the latest one.
pub(crate) fn load(run: &RunDir, step: Option<u64>) -> Result<OrchestratorState> {
    let step = match step {
        Some(s) => s,
        None => *checkpoint_steps(run).last().ok_or_else(|| Error::Checkpoint {
            path: run.checkpoints().display().to_string(),
            message: String::from("no orchestrator checkpoint to resume from (was [ckpt] set?)"),
        })?,
    };
    let path = run.orchestrator_state(step);
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

/// Removes rollouts, evaluation traces and broadcasts of steps after `step` (on a fresh run, `step` = 0: everything
/// an earlier run left except the starting weights), and metrics rows after `step`. Returns the
/// torn last line of `metrics.jsonl` it cut (a crash mid-append), for the caller to report where
/// a person sees it.
pub fn clean_after(run: &RunDir, step: u64) -> Result<Option<String>> {
    for dir in [run.rollouts(), run.evals(), run.broadcasts()] {
        for (n, path) in steps_in(&dir) {
            if n > step {
                std::fs::remove_dir_all(&path).map_err(|e| Error::io(&path, &e))?;
            }
        }
    }
    let kept = retain_jsonl(&run.metrics(), |row| row["step"].as_u64().is_some_and(|s| s <= step))?;
    if let Some(torn) = &kept.torn {
        tracing::warn!(file = %run.metrics().display(), torn = %torn, "cut a torn last line left by a crash");
    }
    Ok(kept.torn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips_and_keep_last_prunes_old_ones() {
        let tmp = tempfile::tempdir().unwrap();
        let run = RunDir::new(tmp.path());
        for step in [2, 4, 6] {
            let algos = BTreeMap::from([(String::from("debate/rae"), serde_json::json!({"k": step}))]);
            save(&run, &OrchestratorState::new(step, 1000 + step, algos), Some(2)).unwrap();
        }
        assert_eq!(checkpoint_steps(&run), vec![4, 6], "keep_last = 2");
        let latest = load(&run, None).unwrap();
        assert_eq!((latest.step, latest.sampler), (6, 1006));
        assert_eq!(latest.algorithms["debate/rae"]["k"], 6);
        assert_eq!(load(&run, Some(4)).unwrap().sampler, 1004);
        let err = load(&run, Some(2)).unwrap_err().to_string();
        assert!(err.contains("step_2") && err.contains("cannot read"), "{err}");
        let empty = tempfile::tempdir().unwrap();
        assert!(load(&RunDir::new(empty.path()), None).unwrap_err().to_string().contains("no orchestrator checkpoint"));
    }

    #[test]
    fn clean_after_keeps_earlier_steps_and_their_metrics() {
        let tmp = tempfile::tempdir().unwrap();
        let run = RunDir::new(tmp.path());
        for s in 0..=4 {
            std::fs::create_dir_all(run.broadcast(s)).unwrap();
            std::fs::create_dir_all(run.rollout_step(s)).unwrap();
            std::fs::create_dir_all(run.eval_traces(s).parent().unwrap()).unwrap();
        }
        let rows: String = (1..=4).map(|s| format!("{{\"step\":{s}}}\n")).collect();
        std::fs::write(run.metrics(), rows + "{\"step\":5,\"rew").unwrap();
        assert_eq!(clean_after(&run, 2).unwrap().as_deref(), Some("{\"step\":5,\"rew"), "the torn line is returned");
        let left = |dir: PathBuf| steps_in(&dir).into_iter().map(|(n, _)| n).collect::<Vec<_>>();
        assert_eq!(left(run.broadcasts()), vec![0, 1, 2]);
        assert_eq!(left(run.rollouts()), vec![0, 1, 2]);
        assert_eq!(left(run.evals()), vec![0, 1, 2]);
        assert_eq!(std::fs::read_to_string(run.metrics()).unwrap(), "{\"step\":1}\n{\"step\":2}\n");
        clean_after(&run, 0).unwrap();
        assert_eq!(left(run.broadcasts()), vec![0], "a fresh run keeps only the starting weights");
    }
}
