//! What a person watching `rl rl` sees: one line per orchestrator step (reward, the trainer's
//! latest mismatch KL and speed, why a step trained nothing, failed reward functions), one per
//! evaluation (each eval env's reward and pass@k, where its rollouts are), warnings
//! when trainer steps train nothing, `<run>/curves.svg` redrawn and the TensorBoard mirror, all fed
//! by the rows the orchestrator and trainer append to their `metrics.jsonl`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use rl_run::RunDir;
use rl_run::{MetricsRow, RolloutMetrics, TrainerRow, read_jsonl};

use crate::plot::rl_curves;

/// The trainer's numbers of one step, for the progress line.
struct Trained {
    mismatch_kl: f64,
    tokens_per_s: f64,
    skipped: bool,
}

/// Follows the run's metrics files and prints what is new.
pub(crate) struct Progress {
    started: Instant,
    max_steps: Option<u64>,
    /// The last orchestrator step shown (steps up to it were shown by an earlier launch when
    /// resuming).
    shown: u64,
    trained: BTreeMap<u64, Trained>,
    /// The step of the last evaluation shown (`None`: none yet, not even the step-0 one).
    evals_shown: Option<u64>,
    /// The streak of steps that trained nothing last warned about.
    warned_idle: usize,
    board: Option<Board>,
}

impl Progress {
    /// Shows steps after `shown`; mirrors rows into TensorBoard under `tensorboard` when given.
    pub(crate) fn new(max_steps: Option<u64>, shown: u64, tensorboard: Option<&Path>) -> anyhow::Result<Self> {
        let board = tensorboard.map(|dir| Board::open(dir, shown)).transpose()?;
        // A resumed run showed its evaluations up to `shown` before.
        let evals_shown = (shown > 0).then_some(shown);
        Ok(Progress {
            started: Instant::now(),
            max_steps,
            shown,
            evals_shown,
            trained: BTreeMap::new(),
            warned_idle: 0,
            board,
        })
    }

    /// The step the run is waiting for.
    pub(crate) fn waiting_for(&self) -> u64 {
        self.shown + 1
    }

    /// Prints a line per step finished since the last call (rows are read as they are written; a
    /// row being written is skipped until complete); returns whether there was one.
    pub(crate) fn observe(&mut self, run: &RunDir, out: &mut impl Write) -> anyhow::Result<bool> {
        for row in read_jsonl::<TrainerRow>(&run.trainer_metrics()).unwrap_or_default() {
            let t = Trained {
                mismatch_kl: row.mismatch_kl,
                tokens_per_s: row.tokens_per_s,
                skipped: row.optimizer_skipped,
            };
            self.trained.insert(row.step, t);
        }
        let mut stepped = false;
        for row in read_jsonl::<MetricsRow>(&run.metrics()).unwrap_or_default() {
            if self.evals_shown.is_none_or(|s| row.step > s)
                && let Some(line) = eval_line(&row, &run.eval_traces(row.step))
            {
                self.evals_shown = Some(row.step);
                writeln!(out, "{line}")?;
            }
            let Some(rollouts) = row.rollouts.as_ref().filter(|_| row.step > self.shown) else { continue };
            self.shown = row.step;
            stepped = true;
            self.step_line(&row, rollouts, run, out)?;
        }
        if let Some(b) = self.board.as_mut() {
            b.mirror(run)?;
        }
        if stepped && let Err(e) = rl_curves(run) {
            tracing::warn!("could not draw the run's curves: {e:#}");
        }
        Ok(stepped)
    }

    fn step_line(
        &mut self,
        row: &MetricsRow,
        rollouts: &RolloutMetrics,
        run: &RunDir,
        out: &mut impl Write,
    ) -> anyhow::Result<()> {
        // The latest step that trained tokens (training of this step may still be running; a
        // skipped step has no KL or speed to show).
        let trained = self
            .trained
            .values()
            .rev()
            .find(|t| !t.skipped)
            .map_or(String::from("trainer: no step trained yet"), |t| {
                format!("mismatch_kl {:.1e} | trainer {:.0} tok/s", t.mismatch_kl, t.tokens_per_s)
            });
        if let Some(warning) = idle_warning(self.trained.values().map(|t| t.skipped), &mut self.warned_idle) {
            writeln!(out, "{warning}")?;
        }
        writeln!(
            out,
            "step {}{} | reward {:.4}{} | {trained}{} | elapsed {:.0}s",
            row.step,
            self.max_steps.map(|m| format!("/{m}")).unwrap_or_default(),
            rollouts.reward_mean,
            member_rewards(row),
            nothing_to_train(rollouts).unwrap_or_default(),
            self.started.elapsed().as_secs_f64()
        )?;
        if let Some(note) = reward_error_note(row, &run.traces(row.step)) {
            writeln!(out, "{note}")?;
        }
        Ok(())
    }
}

/// The line of the evaluation a row holds, if any: per eval env its mean reward, examples, errors
/// and its widest pass@k, then where its rollouts are.
fn eval_line(row: &MetricsRow, traces: &Path) -> Option<String> {
    let get = |env: &str, key: &str| row.keyed.get(&format!("eval/{env}/{key}")).and_then(serde_json::Value::as_f64);
    let envs: Vec<&str> = row
        .keyed
        .keys()
        .filter_map(|k| k.strip_prefix("eval/")?.strip_suffix("/examples"))
        .filter(|env| get(env, "reward/mean").is_some() && get(env, "errors").is_some())
        .collect();
    if envs.is_empty() {
        return None;
    }
    let parts: Vec<String> = envs
        .iter()
        .map(|env| {
            let errors = get(env, "errors").unwrap_or(0.0);
            let mut part = format!(
                "{env} reward {:.4} ({} examples{})",
                get(env, "reward/mean").unwrap_or(f64::NAN),
                get(env, "examples").unwrap_or(0.0),
                if errors > 0.0 { format!(", {errors} failed") } else { String::new() }
            );
            let prefix = format!("eval/{env}/pass@");
            let widest = row
                .keyed
                .iter()
                .filter_map(|(k, v)| Some((k.strip_prefix(&prefix)?.parse::<u64>().ok()?, v.as_f64()?)))
                .max_by_key(|(k, _)| *k);
            if let Some((k, v)) = widest {
                part.push_str(&format!(", pass@{k} {v:.4}"));
            }
            part
        })
        .collect();
    Some(format!("eval at step {} | {} | rollouts in {}", row.step, parts.join(" | "), traces.display()))
}

/// Reward functions that failed in a step (they score 0, so a run would otherwise learn from zeros
/// quietly): which envs, how often, and the first failure from the step's traces when still there.
fn reward_error_note(row: &MetricsRow, traces: &Path) -> Option<String> {
    let envs: Vec<String> = row
        .keyed
        .iter()
        .filter_map(|(k, v)| {
            let env = k.strip_prefix("env/")?.strip_suffix("/reward_errors")?;
            let share = v.as_f64().filter(|x| *x > 0.0)?;
            Some(format!("{env} {:.0}% of rollouts", share * 100.0))
        })
        .collect();
    if envs.is_empty() {
        return None;
    }
    let first = read_jsonl::<serde_json::Value>(traces).ok().and_then(|lines| {
        lines.iter().find_map(|t| {
            let e = t["reward_errors"].as_array()?.first()?;
            Some(format!("; first: `{}`: {}", e["name"].as_str()?, e["message"].as_str()?))
        })
    });
    Some(format!("  reward functions failed (scored 0): {}{}", envs.join(", "), first.unwrap_or_default()))
}

/// Why a step gave the trainer nothing, for its progress line (a run that trains nothing says why).
/// Each member's mean reward of a multi-agent step (` (debate/debater_a +0.250, ...)`): the
/// rewards of a zero-sum game average to 0, so the step's mean alone says nothing.
fn member_rewards(row: &MetricsRow) -> String {
    let members: Vec<String> = row
        .keyed
        .iter()
        .filter_map(|(k, v)| Some(format!("{} {:+.3}", k.strip_prefix("reward/member/")?, v.as_f64()?)))
        .collect();
    if members.is_empty() { String::new() } else { format!(" ({})", members.join(", ")) }
}

fn nothing_to_train(rollouts: &RolloutMetrics) -> Option<String> {
    if rollouts.samples > 0 {
        return None;
    }
    Some(String::from(match rollouts.groups_uniform {
        Some(u) if u >= 1.0 => " | nothing to train: every group's rewards were equal",
        _ => " | nothing to train: no rollout had a trainable token",
    }))
}

/// A warning when the latest trainer steps (`skipped`, oldest first) trained no token: at 5 in a
/// row, then each time the streak doubles; `warned` remembers the streak last warned about.
fn idle_warning(skipped: impl DoubleEndedIterator<Item = bool>, warned: &mut usize) -> Option<String> {
    let idle = skipped.rev().take_while(|s| *s).count();
    if idle == 0 {
        *warned = 0;
    }
    if idle < 5 || idle < *warned * 2 {
        return None;
    }
    *warned = idle;
    Some(format!(
        "warning: the last {idle} trainer steps trained no token (every sample masked or filtered: all-equal \
         rewards with filter_zero_advantages, or loss masks); see `optimizer_skipped` in trainer/metrics.jsonl"
    ))
}

/// The metrics files mirrored into TensorBoard, each from the step after the last one written.
struct Board {
    writer: crate::tensorboard::EventWriter,
    /// The last step written of each file (`None`: none yet).
    orchestrator: Option<u64>,
    trainer: Option<u64>,
}

impl Board {
    /// Event files in `dir`; a resumed run starts after its checkpoint step `from`.
    fn open(dir: &Path, from: u64) -> anyhow::Result<Self> {
        let writer = crate::tensorboard::EventWriter::create(dir)
            .with_context(|| format!("cannot create a TensorBoard event file in {}", dir.display()))?;
        writeln!(
            std::io::stdout().lock(),
            "TensorBoard events: {} (tensorboard --logdir {})",
            writer.path().display(),
            dir.display()
        )?;
        let from = (from > 0).then_some(from);
        Ok(Board { writer, orchestrator: from, trainer: from })
    }

    /// Writes the rows that appeared since the last call (step 0, an evaluation, included).
    fn mirror(&mut self, run: &RunDir) -> anyhow::Result<()> {
        let files =
            [(run.metrics(), "", &mut self.orchestrator), (run.trainer_metrics(), "trainer/", &mut self.trainer)];
        for (path, prefix, done) in files {
            for row in read_jsonl::<serde_json::Value>(&path).unwrap_or_default() {
                let Some(step) = row["step"].as_u64() else { continue };
                if done.is_none_or(|d| step > d) {
                    self.writer.scalars(step, &row, prefix).context("cannot write a TensorBoard event")?;
                    *done = Some(step);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn failed_reward_functions_are_named_under_the_step_line() {
        let row: rl_run::MetricsRow = serde_json::from_value(serde_json::json!({
            "step": 3, "env/arith/reward_errors": 0.25, "env/other/reward_errors": 0.0
        }))
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let traces = dir.path().join("traces.jsonl");
        assert_eq!(
            super::reward_error_note(&row, &traces).unwrap(),
            "  reward functions failed (scored 0): arith 25% of rollouts"
        );
        let line = r#"{"reward_errors": [{"name": "exact", "message": "ZeroDivisionError: division by zero"}]}"#;
        std::fs::write(&traces, format!("{{\"reward_errors\": []}}\n{line}\n")).unwrap();
        let note = super::reward_error_note(&row, &traces).unwrap();
        assert!(note.ends_with("first: `exact`: ZeroDivisionError: division by zero"), "{note}");
        let clean: rl_run::MetricsRow =
            serde_json::from_value(serde_json::json!({"step": 3, "env/arith/reward_errors": 0.0})).unwrap();
        assert_eq!(super::reward_error_note(&clean, &traces), None);
    }

    #[test]
    fn an_evaluation_gets_its_own_line_with_each_envs_figures_and_its_traces() {
        let row: rl_run::MetricsRow = serde_json::from_value(serde_json::json!({
            "step": 0,
            "eval/wiki-nav/reward/mean": 0.4479, "eval/wiki-nav/examples": 64, "eval/wiki-nav/errors": 0,
            "eval/wiki-nav/avg@4": 0.45, "eval/wiki-nav/pass@1": 0.375, "eval/wiki-nav/pass@4": 0.5,
            "eval/wiki-nav/reward/examples": 1.0,
            "eval/debate/reward/mean": 0.1, "eval/debate/examples": 8, "eval/debate/errors": 2,
            "env/wiki-nav/reward": 0.3
        }))
        .unwrap();
        let traces = std::path::Path::new("out/evals/step_0/traces.jsonl");
        assert_eq!(
            super::eval_line(&row, traces).unwrap(),
            "eval at step 0 | debate reward 0.1000 (8 examples, 2 failed) | wiki-nav reward 0.4479 (64 examples), \
             pass@4 0.5000 | rollouts in out/evals/step_0/traces.jsonl"
        );
        let step: rl_run::MetricsRow =
            serde_json::from_value(serde_json::json!({"step": 3, "env/wiki-nav/reward": 0.3})).unwrap();
        assert_eq!(super::eval_line(&step, traces), None, "a step without an evaluation has no eval line");
    }

    #[test]
    fn the_step_0_evaluation_is_shown_once_and_a_resumed_run_shows_only_later_ones() {
        let dir = tempfile::tempdir().unwrap();
        let run = rl_run::RunDir::new(dir.path());
        let eval = |step: u64| serde_json::json!({"step": step, "eval/rt/reward/mean": 0.5, "eval/rt/examples": 4, "eval/rt/errors": 0});
        let mut step2 = eval(2);
        step2["reward/mean"] = serde_json::json!(0.25);
        let rows = [eval(0).to_string(), step2.to_string()].join("\n") + "\n";
        std::fs::write(run.metrics(), rows).unwrap();
        let shown = |from: u64| {
            let mut p = super::Progress::new(Some(2), from, None).unwrap();
            let mut out = Vec::new();
            p.observe(&run, &mut out).unwrap();
            p.observe(&run, &mut out).unwrap();
            String::from_utf8(out)
                .unwrap()
                .lines()
                .filter(|l| l.starts_with("eval at step"))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        let fresh = shown(0);
        assert_eq!(fresh.len(), 2, "{fresh:?}");
        assert!(fresh[0].starts_with("eval at step 0 | rt reward 0.5000 (4 examples)"), "{fresh:?}");
        assert!(fresh[1].starts_with("eval at step 2 "), "{fresh:?}");
        assert_eq!(shown(1).len(), 1, "resumed after step 1: step 2's evaluation only");
    }

    #[test]
    fn multi_agent_steps_show_each_members_reward() {
        let row: rl_run::MetricsRow = serde_json::from_value(serde_json::json!({
            "step": 3, "reward/member/debate/debater_a": 0.25, "reward/member/debate/debater_b": -0.25, "other": 1.0
        }))
        .unwrap();
        assert_eq!(super::member_rewards(&row), " (debate/debater_a +0.250, debate/debater_b -0.250)");
        let single: rl_run::MetricsRow = serde_json::from_value(serde_json::json!({"step": 3})).unwrap();
        assert_eq!(super::member_rewards(&single), "");
    }

    #[test]
    fn a_step_with_nothing_to_train_says_why_on_its_line() {
        let mut m = rl_run::RolloutMetrics { samples: 0, groups_uniform: Some(1.0), ..Default::default() };
        assert!(super::nothing_to_train(&m).unwrap().contains("every group's rewards were equal"));
        m.groups_uniform = Some(0.5);
        assert!(super::nothing_to_train(&m).unwrap().contains("no rollout had a trainable token"));
        m.samples = 3;
        assert_eq!(super::nothing_to_train(&m), None);
    }

    #[test]
    fn steps_that_train_nothing_are_warned_about_at_5_then_as_the_streak_doubles() {
        let mut warned = 0;
        let mut said = Vec::new();
        let mut rows = vec![false];
        for n in 1..=24 {
            rows.resize(n + 1, true);
            if let Some(w) = super::idle_warning(rows.iter().copied(), &mut warned) {
                said.push(w.split_whitespace().nth(3).unwrap().to_owned());
            }
        }
        assert_eq!(said, ["5", "10", "20"]);
        rows.push(false);
        assert!(super::idle_warning(rows.iter().copied(), &mut warned).is_none());
        assert_eq!(warned, 0, "a trained step ends the streak");
    }
}
