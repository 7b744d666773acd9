//! `InferenceConfig`: the embedded OpenAI-compatible inference server.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{ConfigError, Result};
use crate::shared::{Device, Dtype, LogConfig, ModelConfig, seconds};

/// The embedded inference server (candle), OpenAI-compatible with the vLLM extensions the env server uses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct InferenceConfig {
    /// The model served.
    pub model: ModelConfig,
    /// Address to bind (loopback by default).
    pub host: String,
    /// Port to bind; 0 picks a free one and reports it on stdout.
    pub port: u16,
    /// Most sequences decoded together in one batch.
    pub max_batch_size: u32,
    /// Memory for prompt caching, in MiB (0 = off): the keys and values of recent prompts are
    /// kept, and a request whose prompt starts with a kept one (the rest of a GRPO group, the next
    /// turn of an episode) prefills only the remainder. Dropped least recently used first, and
    /// whenever the weights change.
    pub prefix_cache_mib: u32,
    /// Longest prompt + completion, in tokens (unset: the model's `max_position_embeddings`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_model_len: Option<u32>,
    /// Most requests queued or running at once; more are refused with 503.
    pub max_pending_requests: u32,
    /// Largest accepted request body, in bytes.
    pub max_request_bytes: u64,
    /// Per-request timeout, in seconds (also the limit for reading a weight update).
    pub request_timeout_s: f64,
    /// `/health` answers 503 ("stuck") when the engine has had work but finished no step for this
    /// many seconds (one step is one forward call for the whole batch).
    pub stuck_after_s: f64,
    /// Where to run.
    pub device: Device,
    /// Precision of the model: on the CPU, f32 runs the fused CPU kernels and bf16 runs them with
    /// the weights held in bf16 (half the bytes per decoded token; activations, caches and sums
    /// f32), f16 runs candle's ops; on CUDA any dtype runs candle's ops with caches in that dtype.
    pub dtype: Dtype,
    /// Seed for requests that do not set one.
    pub seed: u64,
    /// Where the sampling fields a request leaves out come from, as vLLM's `--generation-config`:
    /// `auto` (unset, standalone) takes `temperature`, `top_p`, `top_k`, `min_p`,
    /// `repetition_penalty` and `max_new_tokens` (as `max_tokens`) from the model's
    /// `generation_config.json` where they differ from transformers' defaults, as vLLM does (Qwen3:
    /// temperature 0.6, top_p 0.95, top_k 20); `vllm` uses the neutral defaults (temperature 1, no
    /// truncation). `rl rl` serves its policy with `vllm` unless this is set, as prime-rl does:
    /// RL samples the distribution the trainer computes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation_config: Option<GenerationConfigSource>,
    /// Tool-call parser (vLLM's names): `hermes` (`<tool_call>{...}</tool_call>`, Qwen),
    /// `llama3_json` (a `{"name", "parameters"}` object, Llama 3.1+), `none`; `auto` picks the
    /// format the model's chat template renders an assistant's tool call in.
    pub tool_call_parser: String,
    /// Reasoning parser (vLLM's `--reasoning-parser`): `qwen3` or `deepseek_r1` split a thinking
    /// model's reply at `</think>` into `reasoning_content` and `content` (chat completions,
    /// streamed or not, and the Responses API's `reasoning` items); `none` (the default, as vLLM's)
    /// leaves the reply whole. The token routes RL samples through are not affected.
    pub reasoning_parser: String,
    /// Name of an environment variable holding the API key: every route but `/health` then needs
    /// `Authorization: Bearer <key>` (vLLM's `--api-key`). Keys never sit in config files.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Name of an environment variable holding the admin key: `/update_weights`, `/pause` and
    /// `/resume` then need it (the API key is not enough), so a client allowed to generate cannot
    /// swap weights. Unset: admin routes take the API key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_key_env: Option<String>,
    /// `/update_weights` loads only directories under one of these (`rl rl`: the run's broadcast
    /// directory). Empty: any directory the server can read (guard the route with
    /// `admin_key_env` then).
    pub weight_roots: Vec<PathBuf>,
    /// Directory for dry-run output and logs.
    pub output_dir: PathBuf,
    /// Logging.
    pub log: LogConfig,
}

impl Default for InferenceConfig {
    fn default() -> Self {
        InferenceConfig {
            model: ModelConfig::default(),
            host: String::from("127.0.0.1"),
            port: 8000,
            max_batch_size: 32,
            prefix_cache_mib: 256,
            max_model_len: None,
            max_pending_requests: 1024,
            max_request_bytes: 8 * 1024 * 1024,
            request_timeout_s: 600.0,
            stuck_after_s: 300.0,
            device: Device::Cpu,
            dtype: Dtype::F32,
            seed: 0,
            generation_config: None,
            tool_call_parser: String::from("auto"),
            reasoning_parser: String::from("none"),
            api_key_env: None,
            admin_key_env: None,
            weight_roots: Vec::new(),
            output_dir: PathBuf::from("outputs"),
            log: LogConfig::default(),
        }
    }
}

/// vLLM's `--generation-config` choices (`inference.generation_config`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum GenerationConfigSource {
    /// The model's `generation_config.json` fills the sampling fields a request leaves out.
    Auto,
    /// Neutral defaults.
    Vllm,
}

/// Tool-call parsers the inference server knows.
pub const TOOL_CALL_PARSERS: &[&str] = &["auto", "hermes", "llama3_json", "none"];

/// Reasoning parsers `inference.reasoning_parser` accepts (vLLM's names).
pub const REASONING_PARSERS: &[&str] = &["none", "qwen3", "deepseek_r1"];

impl InferenceConfig {
    /// The OpenAI base URL clients use to reach this server.
    pub fn base_url(&self) -> String {
        format!("http://{}:{}/v1", self.host, self.port)
    }

    /// Checks every rule that involves only the inference server; `key` is the dotted path of this section.
    pub fn validate(&self, key: &str) -> Result<()> {
        let k = |s: &str| if key.is_empty() { s.to_owned() } else { format!("{key}.{s}") };
        if self.host.trim().is_empty() {
            return Err(ConfigError::invalid(k("host"), "must not be empty"));
        }
        if self.max_batch_size == 0 {
            return Err(ConfigError::invalid(k("max_batch_size"), "must be at least 1, got 0"));
        }
        if self.max_model_len == Some(0) {
            return Err(ConfigError::invalid(k("max_model_len"), "must be at least 1 (or unset), got 0"));
        }
        if self.max_pending_requests == 0 {
            return Err(ConfigError::invalid(k("max_pending_requests"), "must be at least 1, got 0"));
        }
        if self.max_request_bytes < 1024 {
            return Err(ConfigError::invalid(k("max_request_bytes"), "must be at least 1024"));
        }
        seconds(&k("request_timeout_s"), self.request_timeout_s)?;
        seconds(&k("stuck_after_s"), self.stuck_after_s)?;
        if !TOOL_CALL_PARSERS.contains(&self.tool_call_parser.as_str()) {
            return Err(ConfigError::invalid(
                k("tool_call_parser"),
                format!("unknown parser {:?}; known: {}", self.tool_call_parser, TOOL_CALL_PARSERS.join(", ")),
            ));
        }
        if !REASONING_PARSERS.contains(&self.reasoning_parser.as_str()) {
            return Err(ConfigError::invalid(
                k("reasoning_parser"),
                format!("unknown parser {:?}; known: {}", self.reasoning_parser, REASONING_PARSERS.join(", ")),
            ));
        }
        Ok(())
    }
}
