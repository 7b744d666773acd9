//! Config types shared by several parts: models, sampling, logging, checkpoints, resume, serving limits.

use std::collections::BTreeMap;
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{ConfigError, Result};
use crate::temperature::Temperature;

/// Free-form table of values (environment args, extra sampling args, env-owned algorithm fields).
pub type Table = BTreeMap<String, serde_json::Value>;

/// A model: a local HF-format directory (config.json, model.safetensors, tokenizer.json,
/// tokenizer_config.json) and the name it is served under.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// Local directory of the HF-format model. Nothing is ever downloaded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// Name the model is served under (the `model` field of OpenAI requests). Defaults to the
    /// directory's last component.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ModelConfig {
    /// The served name: `name`, or else the last component of `path`, or else `"policy"`.
    pub fn served_name(&self) -> String {
        if let Some(name) = &self.name {
            return name.clone();
        }
        self.path
            .as_ref()
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| String::from("policy"))
    }
}

/// Where tensors live.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Device {
    /// The CPU (always available).
    #[default]
    Cpu,
    /// A CUDA GPU (needs a build with the `cuda` feature).
    Cuda,
}

/// Floating-point precision of weights and activations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Dtype {
    /// 32-bit floats (the only sensible choice on CPU).
    #[default]
    F32,
    /// bfloat16 (GPU).
    Bf16,
    /// IEEE half precision (GPU).
    F16,
}

/// Log verbosity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LogLevel {
    /// Only errors.
    Error,
    /// Errors and warnings.
    Warn,
    /// Progress and lifecycle events.
    #[default]
    Info,
    /// Details useful while debugging.
    Debug,
    /// Everything.
    Trace,
}

/// Logging settings of one process.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// Log level of this process.
    pub level: LogLevel,
    /// Write logs as JSON lines instead of text.
    pub json: bool,
}

/// Sampling arguments for rollouts (the OpenAI request fields we send).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingConfig {
    /// Sampling temperature: 0 (greedy) or in [0.01, 2]. The trainer divides logits by the same
    /// value per token.
    pub temperature: Temperature,
    /// Nucleus sampling threshold, in (0, 1].
    pub top_p: f64,
    /// Top-k sampling; unset or -1 disables it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i64>,
    /// Maximum number of tokens generated per turn.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u32>,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Base sampling seed (each rollout derives its own from it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Extra request fields passed through to the model server unchanged (not the fields the
    /// client sets itself, [`RESERVED_REQUEST_FIELDS`]).
    pub extra: Table,
}

/// Chat-request fields the rollout client sets itself: sampling `extra` may not name them (a
/// temperature set there would not be the one the trainer divides by; `stream` or `n` would change
/// the response the client parses).
pub const RESERVED_REQUEST_FIELDS: &[&str] = &[
    "model",
    "messages",
    "tools",
    "n",
    "logprobs",
    "return_token_ids",
    "cache_salt",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "max_completion_tokens",
    "max_tokens",
    "stop",
    "seed",
];

impl Default for SamplingConfig {
    fn default() -> Self {
        SamplingConfig {
            temperature: Temperature::ONE,
            top_p: 1.0,
            top_k: None,
            max_completion_tokens: None,
            stop: Vec::new(),
            seed: None,
            extra: Table::new(),
        }
    }
}

impl SamplingConfig {
    /// Checks ranges; `key` is the dotted path of this section.
    pub fn validate(&self, key: &str) -> Result<()> {
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(ConfigError::invalid(format!("{key}.top_p"), format!("must be in (0, 1], got {}", self.top_p)));
        }
        if let Some(k) = self.top_k
            && k == 0
        {
            return Err(ConfigError::invalid(format!("{key}.top_k"), "must be -1 (off) or at least 1, got 0"));
        }
        if self.max_completion_tokens == Some(0) {
            return Err(ConfigError::invalid(format!("{key}.max_completion_tokens"), "must be at least 1, got 0"));
        }
        if let Some(k) = self.extra.keys().find(|k| RESERVED_REQUEST_FIELDS.contains(&k.as_str())) {
            return Err(ConfigError::invalid(
                format!("{key}.extra.{k}"),
                "is set by the rollout client itself; use the sampling key of that name",
            ));
        }
        Ok(())
    }

    /// Applies an override: every field the override sets wins.
    pub fn merged(&self, over: &SamplingOverride) -> SamplingConfig {
        let mut extra = self.extra.clone();
        if let Some(e) = &over.extra {
            extra.extend(e.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        SamplingConfig {
            temperature: over.temperature.unwrap_or(self.temperature),
            top_p: over.top_p.unwrap_or(self.top_p),
            top_k: over.top_k.or(self.top_k),
            max_completion_tokens: over.max_completion_tokens.or(self.max_completion_tokens),
            stop: over.stop.clone().unwrap_or_else(|| self.stop.clone()),
            seed: over.seed.or(self.seed),
            extra,
        }
    }
}

/// A per-environment sampling override: each field that is set replaces the group's value.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingOverride {
    /// Sampling temperature: 0 (greedy) or in [0.01, 2].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<Temperature>,
    /// Nucleus sampling threshold, in (0, 1].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Top-k sampling; -1 disables it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i64>,
    /// Maximum number of tokens generated per turn.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u32>,
    /// Stop strings (replace the group's list).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop: Option<Vec<String>>,
    /// Base sampling seed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Extra request fields, merged over the group's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extra: Option<Table>,
}

impl SamplingOverride {
    /// The override that sets every field of `s` (used to write resolved configs).
    pub fn from_full(s: &SamplingConfig) -> Self {
        SamplingOverride {
            temperature: Some(s.temperature),
            top_p: Some(s.top_p),
            top_k: s.top_k,
            max_completion_tokens: s.max_completion_tokens,
            stop: Some(s.stop.clone()),
            seed: s.seed,
            extra: Some(s.extra.clone()),
        }
    }
}

/// Checkpoints kept by default: enough to resume after a crash mid-write, small on disk (keeping
/// every one filled 300 MB in a 40-step run of the tiny model).
pub const DEFAULT_KEEP_LAST: u32 = 3;

/// Periodic checkpoints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct CkptConfig {
    /// Write a checkpoint every this many steps.
    pub interval: u64,
    /// Keep only the newest this many checkpoints (default 3; `"None"` or `--no-ckpt.keep-last`
    /// keeps every one). Written as `null` when unset so resolved configs keep "keep all".
    pub keep_last: Option<u32>,
    /// Directory for checkpoints (default: `<run dir>/checkpoints`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dir: Option<PathBuf>,
}

impl Default for CkptConfig {
    fn default() -> Self {
        CkptConfig { interval: 50, keep_last: Some(DEFAULT_KEEP_LAST), dir: None }
    }
}

impl CkptConfig {
    /// Checks ranges; `key` is the dotted path of this section.
    pub fn validate(&self, key: &str) -> Result<()> {
        if self.interval == 0 {
            return Err(ConfigError::invalid(format!("{key}.interval"), "must be at least 1, got 0"));
        }
        if self.keep_last == Some(0) {
            return Err(ConfigError::invalid(
                format!("{key}.keep_last"),
                "must be at least 1 (or \"None\" to keep all)",
            ));
        }
        Ok(())
    }
}

/// Resume from a checkpoint. An empty `[resume]` (or a bare `--resume`) resumes from the latest one.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ResumeConfig {
    /// The checkpoint step to resume from (unset: the latest checkpoint).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
}

impl ResumeConfig {
    /// Checks ranges; `key` is the dotted path of this section.
    pub fn validate(&self, key: &str) -> Result<()> {
        if self.step == Some(0) {
            return Err(ConfigError::invalid(format!("{key}.step"), "steps are 1-indexed; got 0"));
        }
        Ok(())
    }
}

/// Limits of a server process (gRPC env server).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ServeConfig {
    /// Address to bind. Loopback by default; bind elsewhere only on purpose.
    pub host: String,
    /// Port to bind; 0 picks a free one and reports it on stdout.
    pub port: u16,
    /// Maximum number of requests handled at once; more wait.
    pub max_concurrent: u32,
    /// Maximum size of one request or response message, in bytes.
    pub max_message_bytes: u64,
    /// Per-request timeout, in seconds.
    pub request_timeout_s: f64,
    /// Name of an environment variable holding a token every call but `Health` must carry (gRPC
    /// metadata `authorization: Bearer <token>`). The orchestrator, as this server's client,
    /// sends the token from the same variable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_env: Option<String>,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            host: String::from("127.0.0.1"),
            port: 0,
            max_concurrent: 256,
            max_message_bytes: 64 * 1024 * 1024,
            request_timeout_s: 600.0,
            token_env: None,
        }
    }
}

impl ServeConfig {
    /// Checks ranges; `key` is the dotted path of this section.
    pub fn validate(&self, key: &str) -> Result<()> {
        if self.host.trim().is_empty() {
            return Err(ConfigError::invalid(format!("{key}.host"), "must not be empty"));
        }
        if self.max_concurrent == 0 {
            return Err(ConfigError::invalid(format!("{key}.max_concurrent"), "must be at least 1, got 0"));
        }
        if self.max_message_bytes < 1024 {
            return Err(ConfigError::invalid(
                format!("{key}.max_message_bytes"),
                format!("must be at least 1024, got {}", self.max_message_bytes),
            ));
        }
        seconds(&format!("{key}.request_timeout_s"), self.request_timeout_s)
    }
}

/// The secret in the environment variable `var`, which the config key `key` names: keys are read
/// from the environment, never written in config files (resolved configs are saved in run dirs).
pub fn secret_from_env(key: &str, var: &str) -> Result<String> {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => Ok(v.trim().to_owned()),
        _ => Err(ConfigError::invalid(key, format!("names the environment variable {var}, which is not set or empty"))),
    }
}

/// The longest duration a config or request may give in seconds (a week): longer is a mistake,
/// and past ~1.8e19 seconds a duration does not exist at all.
pub const MAX_SECONDS: f64 = 604_800.0;

/// Checks that a float is a duration in seconds: finite, > 0 and at most [`MAX_SECONDS`].
pub(crate) fn seconds(key: &str, v: f64) -> Result<()> {
    if v > 0.0 && v <= MAX_SECONDS {
        Ok(())
    } else {
        Err(ConfigError::invalid(key, format!("must be a number of seconds in (0, {MAX_SECONDS}], got {v}")))
    }
}

/// Checks that a float is finite and > 0.
pub(crate) fn positive(key: &str, v: f64) -> Result<()> {
    if v.is_finite() && v > 0.0 { Ok(()) } else { Err(ConfigError::invalid(key, format!("must be > 0, got {v}"))) }
}

/// Checks that an `http://` or `https://` URL was given.
pub(crate) fn http_url(key: &str, url: &str) -> Result<()> {
    if url.starts_with("http://") || url.starts_with("https://") {
        Ok(())
    } else {
        Err(ConfigError::invalid(key, format!("must be an http:// or https:// URL, got {url:?}")))
    }
}

/// A name used as one file or directory name (run names, env names): non-empty, no path
/// separators, not `.` or `..`, so it can never point outside the directory it is joined to.
pub(crate) fn plain_name(key: &str, name: &str) -> Result<()> {
    if name.is_empty() || name.contains(['/', '\\', '\0']) || name == "." || name == ".." {
        return Err(ConfigError::invalid(
            key,
            format!("must be a plain file name (no `/`, `\\`, `.` or `..`), got {name:?}"),
        ));
    }
    Ok(())
}
