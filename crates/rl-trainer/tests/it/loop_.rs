//! The training loop on disk: broadcasts, metrics, checkpoints, exact resume, timeouts, bad batches.

use std::path::Path;

use candle_core::Tensor;
use prost::Message;
use rl_configs::{CkptConfig, ResumeConfig, TrainerConfig, TrainerModelConfig};
use rl_run::RunDir;
use rl_run::{TrainerRow, read_jsonl, write_atomic};
use rl_trainer::{Error, MicroBatch, RlTrainer, TrainBatch};

use crate::model_dir;

/// Writes a batch where the orchestrator would.
pub(crate) fn write_batch(run: &Path, batch: &TrainBatch) {
    write_atomic(&RunDir::new(run).batch(batch.step), &batch.encode_to_vec()).unwrap();
}

fn broadcast_dir(run: &Path, step: u64) -> std::path::PathBuf {
    RunDir::new(run).broadcast(step)
}

pub(crate) fn synthetic_batch(step: u64) -> TrainBatch {
    let mb = |salt: u32| {
        let ids: Vec<u32> = (0..12).map(|i| 3 + (i * 7 + salt + step as u32) % 30).collect();
        let n = ids.len();
        MicroBatch {
            input_ids: ids,
            position_ids: (0..6).chain(0..6).collect(),
            seq_lens: vec![6, 6],
            loss_mask: (0..n).map(|i| i % 6 >= 3).collect(),
            advantages: (0..n).map(|i| if i < 6 { 1.0 } else { -1.0 }).collect(),
            inference_logprobs: vec![-3.5; n],
            temperatures: vec![1.0; n],
            ce_weights: vec![],
            env_index: vec![0; n],
            parents: vec![],
        }
    };
    TrainBatch {
        step,
        micro_batches: vec![mb(0), mb(5)],
        env_names: vec![String::from("reverse-text")],
        min_policy_version: step - 1,
    }
}

pub(crate) fn config(run: &Path, model: &Path, max_steps: u64) -> TrainerConfig {
    let mut c = TrainerConfig {
        model: TrainerModelConfig { path: Some(model.to_owned()), name: None, seq_len: 64 },
        max_steps: Some(max_steps),
        batch_timeout_s: 5.0,
        output_dir: run.to_owned(),
        ckpt: Some(CkptConfig { interval: 2, keep_last: None, dir: None }),
        ..TrainerConfig::default()
    };
    c.optim =
        rl_configs::OptimConfig::Adamw { lr: 1e-2, weight_decay: 0.01, betas: [0.9, 0.999], eps: 1e-8, max_norm: 1.0 };
    c
}

pub(crate) fn weights_equal(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> bool {
    a.iter().zip(b).all(|((na, ta), (nb, tb))| {
        na == nb
            && ta.flatten_all().unwrap().to_vec1::<f32>().unwrap()
                == tb.flatten_all().unwrap().to_vec1::<f32>().unwrap()
    })
}

#[test]
fn resuming_after_a_checkpoint_gives_bit_identical_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let model = model_dir(tmp.path(), 4);
    let (run_a, run_b) = (tmp.path().join("a"), tmp.path().join("b"));
    for run in [&run_a, &run_b] {
        for step in 1..=4 {
            write_batch(run, &synthetic_batch(step));
        }
    }
    let mut a = RlTrainer::new(&config(&run_a, &model, 4)).unwrap();
    let mut reports = Vec::new();
    a.run(|r| reports.push(r.clone())).unwrap();
    assert_eq!(reports.len(), 4);
    assert!(reports.iter().all(|r| r.grad_norm > 0.0 && r.rl_tokens > 0));

    RlTrainer::new(&config(&run_b, &model, 2)).unwrap().run(|_| {}).unwrap();
    let mut resumed_cfg = config(&run_b, &model, 4);
    resumed_cfg.resume = Some(ResumeConfig::default());
    let mut b = RlTrainer::new(&resumed_cfg).unwrap();
    assert_eq!(b.step, 3, "resumes after the latest checkpoint (step 2)");
    b.run(|_| {}).unwrap();
    assert!(weights_equal(&a.weights(), &b.weights()), "resumed weights differ from the uninterrupted run");
    assert!(
        !weights_equal(&a.weights(), &RlTrainer::new(&config(&run_a, &model, 4)).unwrap().weights()),
        "training changed the weights"
    );
}

#[test]
fn broadcasts_are_written_in_the_broadcast_dtype_and_read_back_as_the_trained_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let model = model_dir(tmp.path(), 6);
    let run = tmp.path().join("run");
    write_batch(&run, &synthetic_batch(1));
    let mut cfg = config(&run, &model, 1);
    cfg.broadcast_dtype = Some(rl_configs::Dtype::Bf16);
    let mut trainer = RlTrainer::new(&cfg).unwrap();
    trainer.run(|_| {}).unwrap();
    let file = broadcast_dir(&run, 1).join("model.safetensors");
    let read = candle_core::safetensors::load(&file, &candle_core::Device::Cpu).unwrap();
    for (name, master) in trainer.weights() {
        let sent = &read[&name];
        assert_eq!(sent.dtype(), candle_core::DType::BF16, "{name}");
        let want = master.to_dtype(candle_core::DType::BF16).unwrap().to_dtype(candle_core::DType::F32).unwrap();
        let got = sent.to_dtype(candle_core::DType::F32).unwrap();
        assert!(weights_equal(&[(name.clone(), want)], &[(name.clone(), got)]), "{name}: the master weights, rounded");
    }
}

#[test]
fn broadcasts_metrics_and_checkpoints_are_written_and_old_broadcasts_cleaned() {
    let tmp = tempfile::tempdir().unwrap();
    let model = model_dir(tmp.path(), 5);
    let run = tmp.path().join("run");
    for step in 1..=5 {
        write_batch(&run, &synthetic_batch(step));
    }
    RlTrainer::new(&config(&run, &model, 5)).unwrap().run(|_| {}).unwrap();
    for step in [2u64, 3, 4, 5] {
        let d = broadcast_dir(&run, step);
        assert!(RunDir::new(&run).broadcast_complete(step) && d.join("model.safetensors").exists(), "step {step}");
    }
    assert!(!broadcast_dir(&run, 0).exists() && !broadcast_dir(&run, 1).exists(), "older broadcasts are removed");
    assert!(RunDir::new(&run).trainer_checkpoint_marker(2).exists());
    assert!(RunDir::new(&run).trainer_checkpoint(4).join("optimizer.safetensors").exists());
    let lines: Vec<serde_json::Value> = read_jsonl(&RunDir::new(&run).trainer_metrics()).unwrap();
    assert_eq!(lines.len(), 5);
    assert!(RunDir::new(&run).trainer_checkpoint_marker(5).exists(), "the last step is checkpointed too");
    for key in [
        "loss",
        "loss/rl",
        "loss/ce",
        "mismatch_kl",
        "entropy",
        "masked_low",
        "masked_high",
        "grad_norm",
        "lr",
        "tokens_per_s",
        "step_time_s",
        "time/forward_s",
        "time/backward_s",
        "time/optimizer_s",
    ] {
        assert!(lines[0].get(key).is_some(), "metric {key}");
    }
    // Every phase took time, and the optimizer's (one phase of the step, after the rows) fits
    // inside the step's time.
    let rows: Vec<TrainerRow> = read_jsonl(&RunDir::new(&run).trainer_metrics()).unwrap();
    for r in &rows {
        assert!(r.forward_s > 0.0 && r.backward_s > 0.0 && r.optimizer_s > 0.0, "step {}: {r:?}", r.step);
        assert!(r.optimizer_s < r.step_time_s, "step {}: {r:?}", r.step);
    }
}

#[test]
fn a_resume_drops_the_metrics_rows_of_steps_it_trains_again() {
    let tmp = tempfile::tempdir().unwrap();
    let model = model_dir(tmp.path(), 4);
    let run = tmp.path().join("run");
    for step in 1..=4 {
        write_batch(&run, &synthetic_batch(step));
    }
    RlTrainer::new(&config(&run, &model, 2)).unwrap().run(|_| {}).unwrap();
    // A crash after step 3 was trained and logged but before it was checkpointed.
    rl_run::append_jsonl(&RunDir::new(&run).trainer_metrics(), &TrainerRow { step: 3, ..TrainerRow::default() })
        .unwrap();
    let mut cfg = config(&run, &model, 4);
    cfg.resume = Some(ResumeConfig::default());
    RlTrainer::new(&cfg).unwrap().run(|_| {}).unwrap();
    let rows: Vec<TrainerRow> = read_jsonl(&RunDir::new(&run).trainer_metrics()).unwrap();
    assert_eq!(rows.iter().map(|r| r.step).collect::<Vec<_>>(), vec![1, 2, 3, 4]);
    assert!(rows[2].tokens > 0, "step 3's row is the retrained one");
}

#[test]
fn a_batch_that_trains_no_token_leaves_weights_and_optimizer_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let model = model_dir(tmp.path(), 4);
    let run = tmp.path().join("run");
    let mut empty = synthetic_batch(1);
    for mb in &mut empty.micro_batches {
        mb.loss_mask.iter_mut().for_each(|m| *m = false);
    }
    write_batch(&run, &empty);
    write_batch(&run, &synthetic_batch(2));
    let mut cfg = config(&run, &model, 1);
    cfg.ckpt = None;
    let mut t = RlTrainer::new(&cfg).unwrap();
    let before = t.weights();
    let mut reports = Vec::new();
    t.run(|r| reports.push(r.clone())).unwrap();
    assert!(reports[0].optimizer_skipped && reports[0].rl_tokens == 0);
    assert!(weights_equal(&before, &t.weights()), "weight decay or momentum moved the weights");
    let rows: Vec<TrainerRow> = read_jsonl(&RunDir::new(&run).trainer_metrics()).unwrap();
    assert!(rows[0].optimizer_skipped);
}

#[test]
fn a_missing_batch_times_out_with_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let model = model_dir(tmp.path(), 6);
    let mut cfg = config(&tmp.path().join("run"), &model, 3);
    cfg.batch_timeout_s = 0.2;
    let err = RlTrainer::new(&cfg).unwrap().run(|_| {}).unwrap_err();
    assert!(matches!(err, Error::BatchTimeout { step: 1, .. }), "{err}");
    assert!(err.to_string().contains("orchestrator"));
    assert!(RunDir::new(tmp.path().join("run")).broadcast_complete(0), "starting weights are broadcast first");
}

#[test]
fn malformed_batches_are_rejected_naming_the_field() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path();
    let mut b = synthetic_batch(1);
    b.micro_batches[1].temperatures.pop();
    write_batch(run, &b);
    let err = rl_trainer::read_batch(&RunDir::new(run), 1).unwrap_err().to_string();
    assert!(err.contains("micro_batches[1].temperatures"), "{err}");
    let mut b = synthetic_batch(2);
    b.micro_batches[0].position_ids[7] = 3;
    write_batch(run, &b);
    assert!(rl_trainer::read_batch(&RunDir::new(run), 2).unwrap_err().to_string().contains("position_ids"));
    // Below the temperature floor, logits / T overflow: refused like a greedy (T = 0) token.
    for t in [0.0, 1e-30] {
        let mut b = synthetic_batch(3);
        b.micro_batches[0].temperatures[2] = t;
        write_batch(run, &b);
        let err = rl_trainer::read_batch(&RunDir::new(run), 3).unwrap_err().to_string();
        assert!(err.contains("temperatures") && err.contains("0.01"), "{err}");
    }
}

/// `dtype = "bf16"` (the GPU recipe, here on CPU through the composed ops): the forward and
/// backward passes run in bf16, the weights and optimizer state stay f32 and follow an f32 run.
#[test]
fn bf16_training_keeps_f32_master_weights_that_follow_f32_training() {
    let tmp = tempfile::tempdir().unwrap();
    let model = model_dir(tmp.path(), 6);
    let mut finals = Vec::new();
    for dtype in [rl_configs::Dtype::F32, rl_configs::Dtype::Bf16] {
        let run = tmp.path().join(format!("{dtype:?}"));
        for step in 1..=2 {
            write_batch(&run, &synthetic_batch(step));
        }
        let mut cfg = config(&run, &model, 2);
        cfg.dtype = dtype;
        let mut t = RlTrainer::new(&cfg).unwrap();
        let mut reports = Vec::new();
        t.run(|r| reports.push(r.clone())).unwrap();
        assert!(reports.iter().all(|r| r.grad_norm.is_finite() && r.grad_norm > 0.0), "{dtype:?}");
        assert!(t.weights().iter().all(|(_, w)| w.dtype() == candle_core::DType::F32), "master weights stay f32");
        finals.push((t.weights(), reports));
    }
    let ((wf, rf), (wb, rb)) = (&finals[0], &finals[1]);
    let rel = (rf[0].grad_norm - rb[0].grad_norm).abs() / rf[0].grad_norm;
    assert!(rel < 0.05, "bf16 gradient norm {} vs f32 {}", rb[0].grad_norm, rf[0].grad_norm);
    let start = RlTrainer::new(&config(&tmp.path().join("fresh"), &model, 2)).unwrap().weights();
    // Adam moves each element by about lr whatever the gradient's size, so compare the update as a
    // whole: the bf16 run's must point the same way as the f32 run's.
    let delta = |w: &[(String, Tensor)]| -> Vec<f32> {
        w.iter()
            .zip(&start)
            .flat_map(|((_, a), (_, s))| (a - s).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap())
            .collect()
    };
    let (da, db) = (delta(wf), delta(wb));
    let dot: f64 = da.iter().zip(&db).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let cosine = dot / (norm(&da) * norm(&db));
    assert!(cosine > 0.9, "the bf16 update points away from the f32 one: cosine {cosine}");
}
