//! Integration tests of rl-model on tiny random models built in-test: gradients reach every weight
//! (and match finite differences), packed/cached/batched forwards agree with plain ones, model
//! directories round-trip.

mod chat_templates;
mod damaged;
mod equivalence;
mod grads;
mod io;
mod lora;

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use rl_model::{CausalLm, Family, ModelConfig, Trainable};

/// A very small config (fast, and small enough for finite differences).
pub(crate) fn micro_config() -> ModelConfig {
    rl_model::micro_config(40)
}

/// The micro config of every family (Qwen3, Qwen2 with q/k/v biases, Llama with all attention
/// biases and llama3 rope scaling).
pub(crate) fn family_configs() -> Vec<ModelConfig> {
    [Family::Qwen3, Family::Qwen2, Family::Llama].into_iter().map(|f| rl_model::micro_config_of(f, 40)).collect()
}

/// The micro config with decode-sized heads (64 wide, whole value tiles on every CPU), `hk`
/// key/value heads each shared by two query heads: a new token's attention takes the one-sweep
/// kernel, split between threads when it is the only sequence.
pub(crate) fn wide_heads_config(hk: usize) -> ModelConfig {
    let mut cfg = micro_config();
    (cfg.head_dim, cfg.num_key_value_heads, cfg.num_attention_heads) = (64, hk, 2 * hk);
    cfg
}

/// Random weights in `dtype`, scaled up so activations are not tiny.
pub(crate) fn weights(cfg: &ModelConfig, seed: u64, dtype: DType) -> HashMap<String, Tensor> {
    rl_model::scaled_random_weights(cfg, seed, 10.0, dtype).unwrap()
}

pub(crate) fn model(cfg: &ModelConfig, seed: u64) -> CausalLm {
    let t = Trainable::from_tensors(cfg, &weights(cfg, seed, DType::F32)).unwrap();
    t.model(cfg, &Device::Cpu).unwrap()
}

pub(crate) fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}
