//! The Qwen3-architecture model: a differentiable candle graph for training (fused ops with real
//! backward passes from `rl-kernels`; candle-nn's fused norm/rope/softmax/sdpa have none) and a CPU
//! runtime computing the same function for generation (KV caches that grow in place, shared
//! prompt prefixes, batched decode steps) and a device runtime for CUDA; HF-format model directories (config.json, model.safetensors under HF names,
//! tokenizer.json, tokenizer_config.json with a Jinja chat template); sampling; `rl model init`.
//!
//! Depends on rl-configs and candle only: it must never depend on tokio, tonic, axum or reqwest.

mod chat;
mod config;
mod device;
mod error;
mod frozen_base;
mod init;
mod layout;
mod lora;
mod model;
mod rng;
pub mod runtime;
mod sampling;
mod tensor_file;
mod token_bytes;
mod tokenizer;
mod weights;

pub use chat::{
    ChatTemplate, QWEN_TEMPLATE, TemplateFunction, TemplateMessage, TemplateToolCall, write_tokenizer_config,
};
pub use config::{Family, ModelConfig, Preset, RopeScaling};
pub use device::{compute_dtype, open_device};
pub use error::{Error, Result};
pub use init::{
    NewTokenizer, PresetOverrides, init_model, init_model_as, init_model_with, micro_config, micro_config_of,
    random_weights, random_weights_as, scaled_random_weights,
};
pub use layout::{
    EMBED, FINAL_NORM, LM_HEAD, LayerWeight, layer_part_shapes, layer_shape, module_path, weight_names, weight_shapes,
};
pub use lora::{
    ADAPTER_CONFIG, ADAPTER_WEIGHTS, Lora, adapter_base_dir, adapter_name, adapter_shapes, check_adapters,
    init_adapters, is_adapter_dir, merge_adapters, read_adapter_dir, write_adapter_dir, write_adapter_files,
};
pub use model::{CausalLm, Pass};
pub use rl_kernels::{RowLayout, Segment, Targets};
pub use rng::SplitMix64;
pub use runtime::{AdapterUpdate, CpuRuntime, Rows, Runtime, SeqCache, SharedPrefix, TensorRuntime};
pub use sampling::{Penalties, Sampler, log_softmax};
pub use tensor_file::write_safetensors;
pub use token_bytes::TokenBytes;
pub use tokenizer::{BpePieces, Offsets, SPECIAL_TOKENS, Tok, write_bpe_tokenizer, write_char_tokenizer};
pub use weights::{
    MODEL_WEIGHTS, Part, Trainable, load_model, load_model_or_adapter, load_trainable, load_weights_for,
    model_from_weights, read_config, read_stored_weights, read_weights, write_model_dir,
};
