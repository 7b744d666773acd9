//! LoRA in the training loop: only the adapters train, move and travel (broadcasts and checkpoints
//! hold PEFT adapter files, a fraction of the weights' bytes), the base never moves, the optimizer
//! holds state for the adapters alone, resume is exact (with adapter dropout too), and a
//! checkpoint of other adapters is refused naming both.

use std::path::Path;

use candle_core::Device;
use rl_configs::{LoraConfig, ResumeConfig};
use rl_run::RunDir;
use rl_trainer::RlTrainer;

use crate::loop_::{config, synthetic_batch, weights_equal, write_batch};
use crate::model_dir;

fn lora_config(run: &Path, model: &Path, steps: u64, rank: u32) -> rl_configs::TrainerConfig {
    dropout_config(run, model, steps, rank, 0.0)
}

fn dropout_config(run: &Path, model: &Path, steps: u64, rank: u32, dropout: f64) -> rl_configs::TrainerConfig {
    let mut c = config(run, model, steps);
    c.lora = Some(LoraConfig { rank, alpha: 2.0 * rank as f64, dropout, ..LoraConfig::default() });
    c
}

fn bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum()
}

#[test]
fn only_adapters_train_travel_and_resume_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let model = model_dir(tmp.path(), 7);
    let (run_a, run_b) = (tmp.path().join("a"), tmp.path().join("b"));
    for run in [&run_a, &run_b] {
        for step in 1..=4 {
            write_batch(run, &synthetic_batch(step));
        }
    }
    let mut a = RlTrainer::new(&lora_config(&run_a, &model, 4, 2)).unwrap();
    let start: Vec<_> = a.weights().into_iter().map(|(n, t)| (n, t.copy().unwrap())).collect();
    assert!(start.iter().all(|(n, _)| n.contains(".lora_")), "only adapters are trained");
    let mut reports = Vec::new();
    a.run(|r| reports.push(r.clone())).unwrap();
    assert!(reports.iter().all(|r| r.grad_norm > 0.0 && !r.optimizer_skipped));
    // Every adapter matrix moved (B starts at zero; A moves once B is non-zero).
    for ((name, before), (_, after)) in start.iter().zip(a.weights()) {
        assert!(!weights_equal(&[(name.clone(), before.clone())], &[(name.clone(), after)]), "{name} did not move");
    }
    // Broadcasts are PEFT adapter directories: the adapters' bytes, not the weights'.
    let run = RunDir::new(&run_a);
    let b4 = run.broadcast(4);
    assert!(rl_model::is_adapter_dir(&b4) && !b4.join("model.safetensors").exists());
    let adapter_values: usize = a.weights().iter().map(|(_, t)| t.elem_count()).sum();
    let weights_bytes = std::fs::metadata(model.join("model.safetensors")).unwrap().len();
    let sent = bytes(&b4);
    assert!(
        sent < weights_bytes && sent < 4 * adapter_values as u64 + 8192,
        "{sent} bytes for {adapter_values} values"
    );
    // The base never moved: the merged model of the last broadcast equals base + adapters, and the
    // final model merged from the trainer is the same function as the trainer's.
    let cfg = rl_model::read_config(&model).unwrap();
    let (_, adapters) = rl_model::read_adapter_dir(&cfg, &b4, &Device::Cpu).unwrap();
    for (name, t) in a.weights() {
        assert!(weights_equal(&[(name.clone(), t)], &[(name.clone(), adapters[&name].clone())]), "{name}");
    }
    let ckpt = run.trainer_checkpoint(4);
    assert!(rl_model::is_adapter_dir(&ckpt), "checkpoints hold the adapters");
    let moments = candle_core::safetensors::load(ckpt.join("optimizer.safetensors"), &Device::Cpu).unwrap();
    let state: usize = moments.values().map(|t| t.elem_count()).sum();
    assert!(state <= 2 * adapter_values + 16, "optimizer state {state} for {adapter_values} adapter values");

    RlTrainer::new(&lora_config(&run_b, &model, 2, 2)).unwrap().run(|_| {}).unwrap();
    let mut resumed = lora_config(&run_b, &model, 4, 2);
    resumed.resume = Some(ResumeConfig::default());
    let mut b = RlTrainer::new(&resumed).unwrap();
    assert_eq!(b.step, 3);
    b.run(|_| {}).unwrap();
    assert!(weights_equal(&a.weights(), &b.weights()), "resumed adapters differ from the uninterrupted run");

    let mut other = lora_config(&run_b, &model, 4, 3);
    other.resume = Some(ResumeConfig::default());
    let err = RlTrainer::new(&other).unwrap_err().to_string();
    assert!(err.contains("rank 2") && err.contains("rank 3"), "{err}");
}

#[test]
fn adapter_dropout_changes_the_training_and_resumes_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let model = model_dir(tmp.path(), 8);
    let runs: Vec<_> = ["plain", "dropped", "resumed"].iter().map(|n| tmp.path().join(n)).collect();
    for run in &runs {
        for step in 1..=3 {
            write_batch(run, &synthetic_batch(step));
        }
    }
    let mut plain = RlTrainer::new(&lora_config(&runs[0], &model, 3, 2)).unwrap();
    plain.run(|_| {}).unwrap();
    let mut dropped = RlTrainer::new(&dropout_config(&runs[1], &model, 3, 2, 0.3)).unwrap();
    let mut reports = Vec::new();
    dropped.run(|r| reports.push(r.clone())).unwrap();
    assert!(reports.iter().all(|r| r.grad_norm > 0.0 && r.grad_norm.is_finite()));
    assert!(!weights_equal(&plain.weights(), &dropped.weights()), "dropout 0.3 trained the same adapters as none");
    // PEFT's config records the dropout the adapters trained with.
    let written: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(RunDir::new(&runs[1]).broadcast(3).join(rl_model::ADAPTER_CONFIG)).unwrap(),
    )
    .unwrap();
    assert_eq!(written["lora_dropout"], 0.3);
    // A resumed run draws the masks the uninterrupted one drew.
    RlTrainer::new(&dropout_config(&runs[2], &model, 2, 2, 0.3)).unwrap().run(|_| {}).unwrap();
    let mut resumed = dropout_config(&runs[2], &model, 3, 2, 0.3);
    resumed.resume = Some(ResumeConfig::default());
    let mut b = RlTrainer::new(&resumed).unwrap();
    assert_eq!(b.step, 3);
    b.run(|_| {}).unwrap();
    assert!(weights_equal(&dropped.weights(), &b.weights()), "resumed adapters differ under dropout");
}
