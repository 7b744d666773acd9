//! The launcher end to end on a very small config: `rl model init`, then `rl rl` for 3 steps with
//! the embedded inference server, an env server, the trainer and the orchestrator as processes.

use crate::{rl, stderr, stdout};

#[test]
fn rl_runs_three_steps_across_all_processes() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny");
    assert!(rl(&["model", "init", "--out", model.to_str().unwrap(), "--seed", "2"]).status.success());
    let o = rl(&[
        "rl",
        "@",
        "configs/ci/smoke.toml",
        "--output-dir",
        tmp.path().to_str().unwrap(),
        "--model.path",
        model.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "stdout:\n{}\nstderr:\n{}", stdout(&o), stderr(&o));
    let run = tmp.path().join("ci-smoke");
    for step in 1..=3 {
        assert!(run.join(format!("rollouts/step_{step}/rank_0.bin")).exists(), "batch for step {step}");
        assert!(run.join(format!("broadcasts/step_{step}/STABLE")).exists(), "weights after step {step}");
        assert!(stdout(&o).contains(&format!("step {step}/3 | reward")), "a progress line per step:\n{}", stdout(&o));
    }
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
    }
    assert!(rows[2]["policy_version"].as_u64().unwrap() >= 1, "the inference server was given newer weights");
    let inference_log = std::fs::read_to_string(run.join("logs/inference.log")).unwrap();
    assert!(inference_log.contains("weights updated"), "update_weights reached the inference server");
    assert!(run.join("trainer/metrics.jsonl").exists());
    let final_model = run.join("model");
    assert!(stdout(&o).contains("final model (after step 3)"), "{}", stdout(&o));
    rl_model::load_model(&final_model, &candle_core::Device::Cpu).expect("the final model directory loads");
}
