//! Integration tests of rl-trainer on tiny random models: the loss formula, its gradient, logprob
//! agreement with generation, the training loop (broadcasts, metrics, checkpoints, exact resume).

mod loop_;
mod lora;
mod loss;

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Tensor};
use rl_model::{ModelConfig, write_model_dir};

/// A very small config (fast, and small enough for finite differences).
pub(crate) fn micro_config() -> ModelConfig {
    rl_model::micro_config(40)
}

/// Random weights in `dtype`, scaled up so activations are not tiny.
pub(crate) fn weights(cfg: &ModelConfig, seed: u64, dtype: DType) -> HashMap<String, Tensor> {
    rl_model::scaled_random_weights(cfg, seed, 10.0, dtype).unwrap()
}

/// Writes a micro model directory.
pub(crate) fn model_dir(dir: &Path, seed: u64) -> std::path::PathBuf {
    let cfg = micro_config();
    let mut w: Vec<(String, Tensor)> = weights(&cfg, seed, DType::F32).into_iter().collect();
    w.sort_by(|a, b| a.0.cmp(&b.0));
    let out = dir.join("model");
    write_model_dir(&out, &cfg, &w, dir).unwrap();
    out
}
