//! The launcher end to end on a very small config: `rl model init`, then `rl rl` for 3 steps with
//! the embedded inference server, an env server, the trainer and the orchestrator as processes;
//! then `--resume` from the step-2 checkpoint. (Signals, crashes and supervision: `supervision.rs`.)

use rl_run::RunDir;
use rl_run::{TrainerRow, read_jsonl};

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

/// `rl rl` with `[trainer.lora]` from a short SFT warm start (so rewards differ within groups):
/// the adapters train, the broadcasts are adapters the inference server serves, and the run ends
/// with `<run>/adapter` and the merged `<run>/model`, which `rl model merge` reproduces.
#[test]
fn rl_trains_lora_adapters_end_to_end() {
    let tmp = tempfile::tempdir().unwrap();
    let (init, out) = (tmp.path().join("tiny"), tmp.path().to_str().unwrap());
    let init_args =
        ["model", "init", "--out", init.to_str().unwrap(), "--seed", "3", "--tokenizer-task", "reverse-text"];
    assert!(rl(&init_args).status.success());
    let mut sft = vec!["sft", "@", "configs/reverse_text/sft.toml", "--output-dir", out, "--model.path"];
    sft.extend([init.to_str().unwrap(), "--max-steps", "30", "--batch-size", "16", "--optim.lr", "0.003"]);
    sft.extend(["--data.args", r#"{"min_len": 3, "max_len": 6}"#]);
    let o = rl(&sft);
    assert!(o.status.success(), "{}", stderr(&o));
    let model = tmp.path().join("reverse-text-sft/model");
    let o = rl(&["rl", "@", "configs/ci/lora.toml", "--output-dir", out, "--model.path", model.to_str().unwrap()]);
    assert!(o.status.success(), "stdout:\n{}\nstderr:\n{}", stdout(&o), stderr(&o));
    let run = RunDir::new(tmp.path().join("ci-lora"));
    assert!(rl_model::is_adapter_dir(&run.broadcast(3)), "broadcasts hold the adapters");
    let rows: Vec<TrainerRow> = read_jsonl(&run.trainer_metrics()).unwrap();
    assert_eq!(rows.len(), 3);
    // Step 1's rollouts come from the base model, which the fresh adapters (B = 0) leave as it is.
    assert!(rows[0].mismatch_kl < 1e-9, "step 1: mismatch KL {}", rows[0].mismatch_kl);
    assert!(rows.iter().all(|r| r.grad_norm > 0.0 && r.mismatch_kl.is_finite()), "the adapters were trained");
    let log = std::fs::read_to_string(run.logs().join("inference.log")).unwrap();
    assert!(log.contains("weights updated"), "the inference server loaded the adapters");
    assert!(stdout(&o).contains("LoRA adapter (after step 3)"), "{}", stdout(&o));
    let cfg = rl_model::read_config(&model).unwrap();
    let (lora, _) = rl_model::read_adapter_dir(&cfg, &run.adapter(), &candle_core::Device::Cpu).unwrap();
    assert_eq!(lora.shape.rank, 4);
    let merged = tmp.path().join("merged");
    let m = rl(&[
        "model",
        "merge",
        "--base",
        model.to_str().unwrap(),
        "--adapter",
        run.adapter().to_str().unwrap(),
        "--out",
        merged.to_str().unwrap(),
    ]);
    assert!(m.status.success(), "{}", stderr(&m));
    let (a, b) = (
        rl_model::read_weights(&run.model(), &candle_core::Device::Cpu).unwrap(),
        rl_model::read_weights(&merged, &candle_core::Device::Cpu).unwrap(),
    );
    let base = rl_model::read_weights(&model, &candle_core::Device::Cpu).unwrap();
    let q = "model.layers.0.self_attn.q_proj.weight";
    let diff = |x: &candle_core::Tensor, y: &candle_core::Tensor| {
        (x - y).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap()
    };
    assert_eq!(diff(&a[q], &b[q]), 0.0, "rl model merge writes the run's final model");
    assert!(diff(&a[q], &base[q]) > 0.0, "the adapted projection moved");
    let k = "model.layers.0.self_attn.k_proj.weight";
    assert_eq!(diff(&a[k], &base[k]), 0.0, "a projection without an adapter did not");
    let again = rl(&[
        "model",
        "merge",
        "--base",
        model.to_str().unwrap(),
        "--adapter",
        model.to_str().unwrap(),
        "--out",
        tmp.path().join("not-merged").to_str().unwrap(),
    ]);
    assert!(!again.status.success() && stderr(&again).contains("adapter_config.json"), "{}", stderr(&again));
}
