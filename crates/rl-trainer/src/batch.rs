//! Reading training batches (`RunDir::batch`, one protobuf `TrainBatch` the orchestrator writes
//! atomically): polled with a timeout, validated before use.

use std::time::{Duration, Instant};

use prost::Message;
use rl_configs::Temperature;
use rl_proto::train::v1::{MicroBatch, TrainBatch};
use rl_run::RunDir;

use crate::error::{Error, Result};

/// Reads and validates the batch of `step`.
pub fn read_batch(run: &RunDir, step: u64) -> Result<TrainBatch> {
    let path = run.batch(step);
    let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
    let batch = TrainBatch::decode(bytes.as_slice())
        .map_err(|e| Error::BadBatch { path: path.clone(), message: format!("not a TrainBatch: {e}") })?;
    validate(&batch, step).map_err(|message| Error::BadBatch { path, message })?;
    Ok(batch)
}

/// Waits for the batch of `step` (polling), then reads it.
pub fn wait_for_batch(run: &RunDir, step: u64, timeout: Duration) -> Result<TrainBatch> {
    let path = run.batch(step);
    let start = Instant::now();
    while !path.exists() {
        if start.elapsed() >= timeout {
            return Err(Error::BatchTimeout { step, path, waited_s: start.elapsed().as_secs_f64() });
        }
        std::thread::sleep(rl_run::POLL_INTERVAL);
    }
    read_batch(run, step)
}

fn validate(batch: &TrainBatch, step: u64) -> std::result::Result<(), String> {
    if batch.step != step {
        return Err(format!("holds step {} but was read as step {step}", batch.step));
    }
    for (i, mb) in batch.micro_batches.iter().enumerate() {
        check_micro(mb, batch.env_names.len()).map_err(|m| format!("micro_batches[{i}].{m}"))?;
    }
    Ok(())
}

fn check_micro(mb: &MicroBatch, envs: usize) -> std::result::Result<(), String> {
    let n = mb.input_ids.len();
    let required: [(&str, usize); 6] = [
        ("position_ids", mb.position_ids.len()),
        ("loss_mask", mb.loss_mask.len()),
        ("advantages", mb.advantages.len()),
        ("inference_logprobs", mb.inference_logprobs.len()),
        ("temperatures", mb.temperatures.len()),
        ("env_index", mb.env_index.len()),
    ];
    for (name, len) in required {
        if len != n {
            return Err(format!("{name}: {len} entries for {n} tokens"));
        }
    }
    for (name, len) in [("ce_weights", mb.ce_weights.len())] {
        if len != 0 && len != n {
            return Err(format!("{name}: {len} entries for {n} tokens (must be {n} or empty)"));
        }
    }
    let total: u64 = mb.seq_lens.iter().map(|&l| u64::from(l)).sum();
    if total != n as u64 {
        return Err(format!("seq_lens: sum {total} differs from {n} tokens"));
    }
    if !mb.parents.is_empty() && mb.parents.len() != mb.seq_lens.len() {
        return Err(format!(
            "parents: {} entries for {} samples (must be one per sample or empty)",
            mb.parents.len(),
            mb.seq_lens.len()
        ));
    }
    if let Some(p) = mb.parents.iter().find(|&&p| p < -1) {
        return Err(format!("parents: {p} is neither a sample index nor -1"));
    }
    let layout = crate::loss::row_layout(mb).map_err(|e| e.to_string())?;
    if let Some(i) = layout.positions().iter().zip(&mb.position_ids).position(|(a, b)| a != b) {
        return Err(format!(
            "position_ids: must restart at 0 for each sample without a parent and continue its parent's \
             otherwise (token {i})"
        ));
    }
    // Batches carry temperatures as f32: compare with the floor in f32 (0.01 is not exact).
    let (floor, top) = (Temperature::MIN as f32, Temperature::MAX as f32);
    if let Some(t) = mb.temperatures.iter().find(|t| !(t.is_finite() && **t >= floor && **t <= top)) {
        return Err(format!(
            "temperatures: {t} is not in [{floor}, {top}] (greedy rollouts cannot be trained on, and lower \
             temperatures overflow logits / T)"
        ));
    }
    if mb.advantages.iter().chain(&mb.inference_logprobs).any(|x| !x.is_finite()) {
        return Err(String::from("advantages/inference_logprobs: not finite"));
    }
    if let Some(e) = mb.env_index.iter().find(|&&e| e as usize >= envs.max(1)) {
        return Err(format!("env_index: {e} is out of range of env_names"));
    }
    Ok(())
}
