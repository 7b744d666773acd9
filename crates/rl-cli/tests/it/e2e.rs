//! The launcher end to end on a very small config: `rl model init`, then `rl rl` for 3 steps with
//! the embedded inference server, an env server, the trainer and the orchestrator as processes;
//! then `--resume` from the step-2 checkpoint. (Signals, crashes and supervision: `supervision.rs`.)

use rl_configs::RunDir;
use rl_configs::run_dir::{TrainerRow, read_jsonl};

use crate::{rl, stderr, stdout};

/// `rl rl` on the smoke config under `out` with the test's model, checkpointing every 2 steps.
pub(crate) fn smoke(out: &std::path::Path, model: &std::path::Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["rl", "@", "configs/ci/smoke.toml", "--output-dir", out.to_str().unwrap()];
    args.extend(["--model.path", model.to_str().unwrap(), "--ckpt.interval", "2"]);
    args.extend(extra);
    rl(&args)
}

#[test]
fn rl_runs_three_steps_across_all_processes() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny");
    assert!(rl(&["model", "init", "--out", model.to_str().unwrap(), "--seed", "2"]).status.success());
    // A dry run first: its resolved configs must not make the real run refuse the directory.
    assert!(smoke(tmp.path(), &model, &["--dry-run"]).status.success());
    let o = smoke(tmp.path(), &model, &[]);
    assert!(o.status.success(), "stdout:\n{}\nstderr:\n{}", stdout(&o), stderr(&o));
    let run = tmp.path().join("ci-smoke");
    for step in 1..=3 {
        assert!(run.join(format!("rollouts/step_{step}/rank_0.bin")).exists(), "batch for step {step}");
        assert!(run.join(format!("broadcasts/step_{step}/STABLE")).exists(), "weights after step {step}");
        assert!(stdout(&o).contains(&format!("step {step}/3 | reward")), "a progress line per step:\n{}", stdout(&o));
    }
    assert!(!stdout(&o).contains("NaN"), "progress lines show no NaN:\n{}", stdout(&o));
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 3, "rewards logged for every step");
    // A random model writes no tags, so every rollout is penalised by 0.3 * step / 3: the reward
    // reveals the training_context.step each env request carried.
    for (i, row) in rows.iter().enumerate() {
        let reward = row["reward/mean"].as_f64().unwrap();
        let full = -0.1 * (i + 1) as f64;
        assert!(
            reward <= 0.0 && reward >= full - 1e-9 && reward < full / 2.0,
            "step {}: reward {reward}, expected about {full}",
            i + 1
        );
        let best = row["reward/group_best"].as_f64().unwrap();
        assert!((reward..=0.0).contains(&best), "step {}: best of group {best}, mean {reward}", i + 1);
        let uniform = row["groups/uniform"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&uniform), "step {}: uniform groups {uniform}", i + 1);
    }
    assert!(rows[2]["policy_version"].as_u64().unwrap() >= 1, "the inference server was given newer weights");
    let inference_log = std::fs::read_to_string(run.join("logs/inference.log")).unwrap();
    assert!(inference_log.contains("weights updated"), "update_weights reached the inference server");
    assert!(!inference_log.contains('\u{1b}'), "log files are plain text, without colour codes");
    assert!(run.join("trainer/metrics.jsonl").exists());
    let final_model = run.join("model");
    assert!(stdout(&o).contains("final model (after step 3)"), "{}", stdout(&o));
    rl_model::load_model(&final_model, &candle_core::Device::Cpu).expect("the final model directory loads");
    let svg = std::fs::read_to_string(run.join("curves.svg")).expect("the run draws its curves");
    assert!(svg.starts_with("<svg") && svg.contains("reward") && svg.contains("mismatch KL"));
    assert!(svg.contains("best of group") && svg.contains("entropy"), "curves show the group best and the entropy");

    // Both processes checkpointed step 2 (the interval) and step 3 (the last step). Resume from
    // step 2, as after a crash during step 3, and go on to step 4.
    let dir = RunDir::new(&run);
    for step in [2, 3] {
        assert!(dir.trainer_checkpoint_marker(step).exists() && dir.orchestrator_state(step).exists(), "step {step}");
    }
    // The crashed run's step-3 batch must be gone before the trainer starts (it reads a batch as
    // soon as one exists): garbage there fails the resume loudly if it is ever read.
    let stale = run.join("rollouts/step_3/rank_0.bin");
    assert!(stale.exists());
    std::fs::write(&stale, b"not a batch").unwrap();
    let o = smoke(tmp.path(), &model, &["--max-steps", "4", "--resume.step", "2"]);
    assert!(o.status.success(), "stdout:\n{}\nstderr:\n{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("from checkpoint step 2"), "{}", stdout(&o));
    assert!(stdout(&o).contains("step 3/4 | reward") && stdout(&o).contains("step 4/4 | reward"), "{}", stdout(&o));
    assert!(!stdout(&o).contains("step 2/4"), "steps up to the checkpoint are not rerun: {}", stdout(&o));
    let steps: Vec<u64> = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, vec![1, 2, 3, 4], "the resumed run replaced steps after the checkpoint");
    let trainer_steps: Vec<u64> =
        read_jsonl::<TrainerRow>(&dir.trainer_metrics()).unwrap().iter().map(|r| r.step).collect();
    assert_eq!(trainer_steps, vec![1, 2, 3, 4], "the trainer's rows of retrained steps are replaced, not repeated");
    assert!(stdout(&o).contains("final model (after step 4)"), "{}", stdout(&o));
}
