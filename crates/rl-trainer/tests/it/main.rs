//! Integration tests of rl-trainer on tiny random models: the loss formula, its gradient, logprob
//! agreement with generation, the training loop (broadcasts, metrics, checkpoints, exact resume).

mod loop_;
mod loss;

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Tensor};
use rl_model::{Preset, Qwen3Config, random_weights, write_model_dir};

/// A very small architecture.
pub(crate) fn micro_config() -> Qwen3Config {
    let mut cfg = Qwen3Config::preset(Preset::Tiny, 40);
    cfg.hidden_size = 16;
    cfg.intermediate_size = 24;
    cfg.num_hidden_layers = 2;
    cfg.num_attention_heads = 2;
    cfg.num_key_value_heads = 1;
    cfg.head_dim = 8;
    cfg.max_position_embeddings = 64;
    cfg
}

/// Random weights in `dtype`, scaled so the model is not nearly uniform.
pub(crate) fn weights(cfg: &Qwen3Config, seed: u64, dtype: DType) -> HashMap<String, Tensor> {
    random_weights(cfg, seed)
        .unwrap()
        .into_iter()
        .map(|(n, t)| {
            let t = if n.contains("norm") { t } else { (t * 10.0).unwrap() };
            (n, t.to_dtype(dtype).unwrap())
        })
        .collect()
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
