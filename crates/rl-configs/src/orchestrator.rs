//! `OrchestratorConfig`: the trained model and extra endpoints, the actor, training envs, sampling,
//! algorithms, batching, staleness bounds, evaluation and checkpoints.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::algorithms::AlgorithmConfig;
use crate::env_config::{EvalConfig, TrainConfig, TrainEnvConfig};
use crate::error::{ConfigError, Result};
use crate::shared::{CkptConfig, LogConfig, ResumeConfig, SamplingConfig, SamplingOverride, http_url, seconds};

/// Runtime key of the trained model. It cannot be used under `orchestrator.models`.
pub const POLICY_KEY: &str = "policy";

/// Orchestrator: samples tasks, asks env servers for rollout groups, computes advantages, ships batches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct OrchestratorConfig {
    /// The trained model (runtime key `policy`) and the OpenAI-compatible endpoint serving it.
    pub model: PolicyModelConfig,
    /// Extra model endpoints by key (reference models, judges, frozen actors). `policy` is reserved.
    pub models: BTreeMap<String, ModelEndpointConfig>,
    /// Key of the model that samples rollouts: `policy` or a key of `models`.
    pub actor: String,
    /// Training environments and their sampling.
    pub train: TrainConfig,
    /// Algorithms applied to every env that does not set its own list.
    pub algorithms: Vec<AlgorithmConfig>,
    /// Rollouts per training step (a multiple of every env's group size); with
    /// `token_batch_size`, the rollouts of a step's first round.
    pub batch_size: u32,
    /// A step's rollouts hold at least this many tokens (each trained branch's prompt and
    /// completion; prime-rl's `token_batch_size`): after the first round of `batch_size`
    /// rollouts, rounds sized by the tokens a rollout took so far until they do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_batch_size: Option<u64>,
    /// Rollouts per example (the group), unless an env sets its own.
    pub group_size: u32,
    /// Maximum tokens per packed training row.
    pub seq_len: u32,
    /// Number of training steps (unset: run until stopped).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u64>,
    /// Rollouts may be sampled by a policy at most this many versions behind the step they train.
    pub max_async_level: u32,
    /// Finished groups whose policy is more than this many versions old are dropped.
    pub max_off_policy_steps: u32,
    /// Drop groups whose advantages are all zero before packing.
    pub filter_zero_advantages: bool,
    /// Score a rollout whose last model turn was cut at the completion-token limit as 0 before
    /// advantages (verifiers' `zero_truncated_completions`): its reward, and of its per-turn
    /// rewards the cut turn's, become 0. Without it an env whose reward reads only part of the
    /// reply (a tagged answer) lets RL drift into replies that never end.
    pub zero_truncated_completions: bool,
    /// DAPO's dynamic sampling: when the groups whose rewards are all equal (no advantage,
    /// nothing to learn) leave the step with fewer than `batch_size` rollouts that teach, sample
    /// fresh tasks for the missing rollouts, up to this many extra rounds a step; the groups of an
    /// extra round that are uniform too are discarded (counted in `refill/groups_discarded`).
    /// `refill/planned_reward` is the planned round's mean reward, the sampled reward as without
    /// refills. 0: off.
    pub max_refill_rounds: u32,
    /// Seed of the task sampler.
    pub seed: u64,
    /// At most this many groups start a minute, training and eval alike (prime-rl's: a minute's
    /// allowance at once, then one every `60 / tasks_per_minute` s), for rate-limited endpoints;
    /// unset: no limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tasks_per_minute: Option<u32>,
    /// Timeout of one rollout group request, in seconds.
    pub rollout_timeout_s: f64,
    /// How long to wait for env servers and the model endpoint to become healthy, in seconds.
    pub wait_for_ready_s: f64,
    /// A step stops the run when more than this fraction of its groups failed (each group is run
    /// up to 3 times on retryable errors, then dropped; the step proceeds with the rest).
    pub max_dropped_group_fraction: f64,
    /// A step stops the run when more than this fraction of its rollouts had a reward function
    /// fail (raise, return a non-number, time out; such a function scores 0). The default, 1,
    /// never stops: failures are reported on the progress line and in each trace's
    /// `reward_errors`; 0 stops at the first.
    pub max_reward_error_fraction: f64,
    /// Longest wait for the trainer's next weights (the async gate, a resume), in seconds; past
    /// it the orchestrator stops with an error naming the missing broadcast.
    pub trainer_timeout_s: f64,
    /// Online evaluation on held-out splits (off when unset).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval: Option<EvalConfig>,
    /// Orchestrator checkpoints (progress, sampler and algorithm state); off when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ckpt: Option<CkptConfig>,
    /// Resume from a checkpoint; off when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resume: Option<ResumeConfig>,
    /// The run directory: rollouts, broadcasts, checkpoints and metrics live under it.
    pub output_dir: PathBuf,
    /// Logging.
    pub log: LogConfig,
}

impl Default for OrchestratorConfig {
    fn default() -> Self {
        OrchestratorConfig {
            model: PolicyModelConfig::default(),
            models: BTreeMap::new(),
            actor: String::from(POLICY_KEY),
            train: TrainConfig::default(),
            algorithms: vec![AlgorithmConfig::from_id("grpo")],
            batch_size: 16,
            token_batch_size: None,
            group_size: 4,
            seq_len: 2048,
            max_steps: None,
            max_async_level: 1,
            max_off_policy_steps: 8,
            filter_zero_advantages: true,
            zero_truncated_completions: false,
            max_refill_rounds: 0,
            seed: 0,
            tasks_per_minute: None,
            rollout_timeout_s: 600.0,
            wait_for_ready_s: 300.0,
            trainer_timeout_s: 1800.0,
            max_dropped_group_fraction: 0.5,
            max_reward_error_fraction: 1.0,
            eval: None,
            ckpt: None,
            resume: None,
            output_dir: PathBuf::from("outputs"),
            log: LogConfig::default(),
        }
    }
}

/// The trained model and its endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyModelConfig {
    /// Local HF-format directory of the model (used for its name and tokenizer).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// Served model name (default: the directory's last component).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// OpenAI-compatible base URL of the inference server (ends in `/v1`), or a list of them
    /// (replicas: groups go to the least loaded, weights are loaded into each). Admin calls
    /// (`/update_weights`) go to the same hosts.
    pub base_url: crate::BaseUrls,
    /// Request timeout, in seconds.
    pub timeout_s: f64,
    /// Name of the environment variable holding the server's API key (sent as a bearer token by
    /// the orchestrator and, through each request, by env servers). `rl rl` copies
    /// `inference.api_key_env` here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Name of the environment variable holding the admin key for `/update_weights` (unset: the API
    /// key). `rl rl` copies `inference.admin_key_env` here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_key_env: Option<String>,
    /// Extra HTTP headers on every request to the endpoint (e.g. routing hints for a gateway).
    pub headers: std::collections::BTreeMap<String, String>,
    /// With `[trainer.lora]` against vLLM: the name each step's adapter is loaded under through
    /// vLLM's LoRA API (`POST /v1/load_lora_adapter`, in place), and the model requests name from
    /// the first trained step on (step 0 samples the base, served as `name`). Unset: adapters go
    /// through `/update_weights` (`rl inference` merges them into its base).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora_name: Option<String>,
}

impl Default for PolicyModelConfig {
    fn default() -> Self {
        PolicyModelConfig {
            path: None,
            name: None,
            base_url: crate::BaseUrls::from("http://127.0.0.1:8000/v1"),
            timeout_s: 600.0,
            api_key_env: None,
            admin_key_env: None,
            headers: std::collections::BTreeMap::new(),
            lora_name: None,
        }
    }
}

/// An extra OpenAI-compatible model endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelEndpointConfig {
    /// OpenAI-compatible base URL (ends in `/v1`).
    pub base_url: String,
    /// Model name sent in requests.
    pub name: String,
    /// The endpoint returns and scores token ids (`return_token_ids`, `prompt_logprobs`): needed to
    /// act as a trained-on actor or to score reference logprobs.
    #[serde(default)]
    pub tokens: bool,
    /// Request timeout, in seconds.
    #[serde(default = "default_timeout")]
    pub timeout_s: f64,
    /// Name of the environment variable holding the endpoint's API key (hosted judges and
    /// opponents), sent as a bearer token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Extra HTTP headers on every request to the endpoint.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub headers: std::collections::BTreeMap<String, String>,
}

fn default_timeout() -> f64 {
    600.0
}

impl OrchestratorConfig {
    /// The algorithms an env runs: its own list, or the orchestrator's.
    pub fn env_algorithms<'a>(&'a self, env: &'a TrainEnvConfig) -> &'a [AlgorithmConfig] {
        env.algorithms.as_deref().unwrap_or(&self.algorithms)
    }

    /// The group size an env uses.
    pub fn env_group_size(&self, env: &TrainEnvConfig) -> u32 {
        env.group_size.unwrap_or(self.group_size)
    }

    /// The sampling an env uses: the group's `train.sampling` with the env's override on top.
    pub fn env_sampling(&self, env: &TrainEnvConfig) -> SamplingConfig {
        self.train.sampling.merged(&env.sampling)
    }

    /// Fills inherited per-env values in (group size, algorithms, full sampling), so a written
    /// resolved config says exactly what each env runs with.
    pub fn resolve(&mut self) {
        let group = self.group_size;
        let algorithms = self.algorithms.clone();
        let sampling = self.train.sampling.clone();
        for env in &mut self.train.env {
            env.group_size.get_or_insert(group);
            env.algorithms.get_or_insert_with(|| algorithms.clone());
            env.sampling = SamplingOverride::from_full(&sampling.merged(&env.sampling));
        }
    }

    /// Checks every rule that involves only the orchestrator; `key` is the dotted path of this section.
    pub fn validate(&self, key: &str) -> Result<()> {
        let k = |s: &str| if key.is_empty() { s.to_owned() } else { format!("{key}.{s}") };
        self.model.base_url.validate(&k("model.base_url"))?;
        seconds(&k("model.timeout_s"), self.model.timeout_s)?;
        if let Some(lora) = &self.model.lora_name {
            if lora.trim().is_empty() || lora.chars().any(char::is_whitespace) {
                return Err(ConfigError::invalid(k("model.lora_name"), "must be a name without spaces"));
            }
            if self.model.name.as_deref() == Some(lora.as_str()) {
                return Err(ConfigError::invalid(
                    k("model.lora_name"),
                    "must differ from `model.name`: vLLM serves the base under `name` and the adapter under \
                     `lora_name`",
                ));
            }
        }
        for (name, m) in &self.models {
            if name == POLICY_KEY {
                return Err(ConfigError::invalid(
                    k("models.policy"),
                    "`policy` is the reserved key of the trained model: configure it under `orchestrator.model`",
                ));
            }
            http_url(&k(&format!("models.{name}.base_url")), &m.base_url)?;
            seconds(&k(&format!("models.{name}.timeout_s")), m.timeout_s)?;
            if m.name.trim().is_empty() {
                return Err(ConfigError::invalid(k(&format!("models.{name}.name")), "must not be empty"));
            }
        }
        if self.actor != POLICY_KEY && !self.models.contains_key(&self.actor) {
            return Err(ConfigError::invalid(
                k("actor"),
                format!(
                    "names model `{}`, which is neither `policy` nor a key of `models` ({})",
                    self.actor,
                    self.model_keys()
                ),
            ));
        }
        if self.batch_size == 0 {
            return Err(ConfigError::invalid(k("batch_size"), "must be at least 1, got 0"));
        }
        if self.tasks_per_minute == Some(0) {
            return Err(ConfigError::invalid(k("tasks_per_minute"), "must be at least 1, got 0"));
        }
        match self.token_batch_size {
            Some(0) => return Err(ConfigError::invalid(k("token_batch_size"), "must be at least 1, got 0")),
            Some(_) if self.max_refill_rounds > 0 => {
                return Err(ConfigError::invalid(
                    k("token_batch_size"),
                    "and max_refill_rounds both add rounds to a step (to a token count, to batch_size rollouts \
                     that teach): use one",
                ));
            }
            _ => {}
        }
        if self.group_size == 0 {
            return Err(ConfigError::invalid(k("group_size"), "must be at least 1, got 0"));
        }
        if self.seq_len < 8 {
            return Err(ConfigError::invalid(k("seq_len"), format!("must be at least 8, got {}", self.seq_len)));
        }
        if self.max_steps == Some(0) {
            return Err(ConfigError::invalid(k("max_steps"), "must be at least 1 (or unset), got 0"));
        }
        seconds(&k("rollout_timeout_s"), self.rollout_timeout_s)?;
        seconds(&k("wait_for_ready_s"), self.wait_for_ready_s)?;
        seconds(&k("trainer_timeout_s"), self.trainer_timeout_s)?;
        if !(0.0..=1.0).contains(&self.max_dropped_group_fraction) {
            return Err(ConfigError::invalid(
                k("max_dropped_group_fraction"),
                format!("must be in [0, 1], got {}", self.max_dropped_group_fraction),
            ));
        }
        if !(0.0..=1.0).contains(&self.max_reward_error_fraction) {
            return Err(ConfigError::invalid(
                k("max_reward_error_fraction"),
                format!("must be in [0, 1], got {}", self.max_reward_error_fraction),
            ));
        }
        self.train.sampling.validate(&k("train.sampling"))?;
        self.validate_algorithms(&k("algorithms"), &self.algorithms)?;
        let mut names = BTreeSet::new();
        for (i, env) in self.train.env.iter().enumerate() {
            let ek = k(&format!("train.env.{i}"));
            self.validate_train_env(&ek, env, &k("algorithms"))?;
            if !names.insert(env.display_name().to_owned()) {
                return Err(ConfigError::invalid(
                    format!("{ek}.name"),
                    format!("env name `{}` is used twice: give each env a unique `name`", env.display_name()),
                ));
            }
        }
        if let Some(eval) = &self.eval {
            self.validate_eval(&k("eval"), eval)?;
        }
        if let Some(c) = &self.ckpt {
            c.validate(&k("ckpt"))?;
        }
        if let Some(r) = &self.resume {
            r.validate(&k("resume"))?;
        }
        Ok(())
    }

    /// `algos_key`: the key of the run's algorithms (which an env without its own uses).
    fn validate_train_env(&self, ek: &str, env: &TrainEnvConfig, algos_key: &str) -> Result<()> {
        env.endpoint().validate(ek)?;
        if env.display_name() == "agg" {
            return Err(ConfigError::invalid(format!("{ek}.name"), "`agg` is reserved for aggregate metrics"));
        }
        if !(env.ratio.is_finite() && env.ratio > 0.0) {
            return Err(ConfigError::invalid(format!("{ek}.ratio"), format!("must be > 0, got {}", env.ratio)));
        }
        let group = self.env_group_size(env);
        if group == 0 {
            return Err(ConfigError::invalid(format!("{ek}.group_size"), "must be at least 1, got 0"));
        }
        if !self.batch_size.is_multiple_of(group) {
            return Err(ConfigError::invalid(
                format!("{ek}.group_size"),
                format!("batch_size ({}) must be a multiple of the group size ({group})", self.batch_size),
            ));
        }
        let sampling = self.env_sampling(env);
        sampling.validate(&format!("{ek}.sampling"))?;
        // The trainer divides logits by the sampling temperature: greedy rollouts cannot be trained.
        if sampling.temperature.is_greedy() {
            // Resolved configs copy the group's temperature into every env: blame the group's key
            // when the env's value is the group's.
            let inherited = sampling.temperature == self.train.sampling.temperature;
            let key = match ek.rsplit_once(".env.") {
                Some((train, _)) if inherited => format!("{train}.sampling.temperature"),
                _ => format!("{ek}.sampling.temperature"),
            };
            return Err(ConfigError::invalid(
                key,
                "training rollouts must be sampled at a temperature > 0 (the trainer divides logits by it); \
                 greedy decoding belongs in `orchestrator.eval.sampling`",
            ));
        }
        if let Some(algos) = &env.algorithms {
            self.validate_algorithms(&format!("{ek}.algorithms"), algos)?;
        }
        let (akey, algos) = match &env.algorithms {
            Some(algos) => (format!("{ek}.algorithms"), algos),
            None => (algos_key.to_owned(), &self.algorithms),
        };
        for (i, a) in algos.iter().enumerate() {
            a.validate_group(&format!("{akey}.{i}"), group, env.display_name())?;
        }
        env.curriculum.validate(&format!("{ek}.curriculum"))?;
        Ok(())
    }

    fn validate_eval(&self, key: &str, eval: &EvalConfig) -> Result<()> {
        if eval.interval == 0 {
            return Err(ConfigError::invalid(format!("{key}.interval"), "must be at least 1, got 0"));
        }
        if eval.k == 0 {
            return Err(ConfigError::invalid(format!("{key}.k"), "must be at least 1, got 0"));
        }
        if eval.env.is_empty() {
            return Err(ConfigError::invalid(format!("{key}.env"), "evaluation needs at least one env"));
        }
        let base = self.train.sampling.merged(&eval.sampling);
        let mut names = BTreeSet::new();
        for (i, env) in eval.env.iter().enumerate() {
            let ek = format!("{key}.env.{i}");
            env.endpoint().validate(&ek)?;
            if env.k == Some(0) {
                return Err(ConfigError::invalid(format!("{ek}.k"), "must be at least 1, got 0"));
            }
            if env.interval == Some(0) {
                return Err(ConfigError::invalid(format!("{ek}.interval"), "must be at least 1, got 0"));
            }
            base.merged(&env.sampling).validate(&format!("{ek}.sampling"))?;
            if !names.insert(env.display_name().to_owned()) {
                return Err(ConfigError::invalid(
                    format!("{ek}.name"),
                    format!("eval env name `{}` is used twice", env.display_name()),
                ));
            }
        }
        Ok(())
    }

    pub(crate) fn model_keys(&self) -> String {
        let mut keys = vec![POLICY_KEY.to_owned()];
        keys.extend(self.models.keys().cloned());
        format!("configured: {}", keys.join(", "))
    }
}
