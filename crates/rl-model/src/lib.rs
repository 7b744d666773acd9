//! The Qwen3-architecture model in candle: one definition for training (every op differentiable:
//! candle-nn's fused norm/rope/softmax/sdpa have no backward) and generation (KV cache, batched
//! decode steps); HF-format model directories (config.json, model.safetensors under HF names,
//! tokenizer.json, tokenizer_config.json with a Jinja chat template); sampling; `rl model init`.
//!
//! Depends on rl-configs and candle only: it must never depend on tokio, tonic, axum or reqwest.

mod chat;
mod config;
mod error;
mod init;
mod layers;
mod model;
mod rng;
mod sampling;
mod tokenizer;
mod weights;

pub use chat::{
    ChatTemplate, QWEN_TEMPLATE, TemplateFunction, TemplateMessage, TemplateToolCall, write_tokenizer_config,
};
pub use config::{Preset, Qwen3Config};
pub use error::{Error, Result};
pub use init::{init_model, micro_config, random_weights, scaled_random_weights};
pub use model::{KvCache, Qwen3};
pub use rng::SplitMix64;
pub use sampling::{Sampler, log_softmax};
pub use tokenizer::{SPECIAL_TOKENS, Tok, write_char_tokenizer};
pub use weights::{
    Trainable, load_model, load_trainable, load_weights_for, read_config, read_weights, weight_names, write_model_dir,
    write_safetensors,
};
