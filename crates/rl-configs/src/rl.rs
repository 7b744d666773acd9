//! `RlConfig`: the `rl rl` launcher. Shared top-level keys are propagated into the parts, the run
//! directory is derived, and the parts are checked against each other.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::env_entry::EnvEndpoint;
use crate::env_server::{EnvServerConfig, EnvSpec};
use crate::error::{ConfigError, Result};
use crate::inference::InferenceConfig;
use crate::launcher::LauncherConfig;
use crate::orchestrator::{OrchestratorConfig, PolicyModelConfig};
use crate::shared::{CkptConfig, LogConfig, ModelConfig, ResumeConfig};
use crate::trainer::TrainerConfig;

/// The RL launcher: trainer, orchestrator, optional embedded inference, and one env server per env.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RlConfig {
    /// The trainer.
    pub trainer: TrainerConfig,
    /// The orchestrator.
    pub orchestrator: OrchestratorConfig,
    /// The embedded inference server. When unset, the policy is served elsewhere, at
    /// `orchestrator.model.base_url`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inference: Option<InferenceConfig>,
    /// Shared: the model, propagated to trainer, orchestrator and inference.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelConfig>,
    /// Shared: number of steps, propagated to trainer and orchestrator.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u64>,
    /// Shared: sequence length, propagated to `trainer.model.seq_len` and `orchestrator.seq_len`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq_len: Option<u32>,
    /// Shared: checkpoints, propagated to trainer and orchestrator.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ckpt: Option<CkptConfig>,
    /// Shared: resume from a checkpoint (empty table: the latest), propagated to trainer and orchestrator.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resume: Option<ResumeConfig>,
    /// Shared: logging, propagated to every process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log: Option<LogConfig>,
    /// Root of run directories.
    pub output_dir: PathBuf,
    /// The run; its directory is `<output_dir>/<run.name>`.
    pub run: RunConfig,
    /// How the launcher supervises the processes (liveness, restarts).
    pub launcher: LauncherConfig,
    /// Delete an existing run directory before starting (a fresh run refuses a non-empty one).
    pub clean: bool,
    /// Weights & Biases tracking of the run (off when unset).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wandb: Option<crate::tracking::WandbConfig>,
    /// TensorBoard event files of the run's metrics (off when unset; `[tensorboard]` turns it on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tensorboard: Option<crate::tracking::TensorboardConfig>,
    /// Environment variables set for every process the launcher starts (`HF_HUB_OFFLINE = "0"`).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub env_vars: std::collections::BTreeMap<String, String>,
}

impl Default for RlConfig {
    fn default() -> Self {
        RlConfig {
            trainer: TrainerConfig::default(),
            orchestrator: OrchestratorConfig::default(),
            inference: None,
            model: None,
            max_steps: None,
            seq_len: None,
            ckpt: None,
            resume: None,
            log: None,
            output_dir: PathBuf::from("outputs"),
            run: RunConfig::default(),
            launcher: LauncherConfig::default(),
            clean: false,
            wandb: None,
            tensorboard: None,
            env_vars: std::collections::BTreeMap::new(),
        }
    }
}

/// Identity of a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RunConfig {
    /// Run name (default: `<env names>--<model name>`); the run directory's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl RunConfig {
    /// The name must be usable as one directory name.
    pub fn validate(&self, key: &str) -> Result<()> {
        match &self.name {
            Some(name) => crate::shared::plain_name(&format!("{key}.name"), name),
            None => Ok(()),
        }
    }
}

/// Which shared key feeds which keys of the parts. `inference.*` targets apply only when an
/// `[inference]` section exists.
const SHARED_KEYS: &[(&str, &[&str])] = &[
    ("model.path", &["trainer.model.path", "orchestrator.model.path", "inference.model.path"]),
    ("model.name", &["trainer.model.name", "orchestrator.model.name", "inference.model.name"]),
    ("max_steps", &["trainer.max_steps", "orchestrator.max_steps"]),
    ("seq_len", &["trainer.model.seq_len", "orchestrator.seq_len"]),
    ("ckpt.interval", &["trainer.ckpt.interval", "orchestrator.ckpt.interval"]),
    ("ckpt.keep_last", &["trainer.ckpt.keep_last", "orchestrator.ckpt.keep_last"]),
    ("ckpt.dir", &["trainer.ckpt.dir", "orchestrator.ckpt.dir"]),
    ("resume.step", &["trainer.resume.step", "orchestrator.resume.step"]),
    ("log.level", &["trainer.log.level", "orchestrator.log.level", "inference.log.level"]),
    ("log.json", &["trainer.log.json", "orchestrator.log.json", "inference.log.json"]),
];

/// Sections whose mere presence (even empty) enables the same section in the parts.
const SHARED_SECTIONS: &[(&str, &[&str])] =
    &[("ckpt", &["trainer.ckpt", "orchestrator.ckpt"]), ("resume", &["trainer.resume", "orchestrator.resume"])];

/// Propagates shared top-level keys into the parts of a raw (merged, untyped) config: fills absent
/// keys, accepts equal ones, and rejects different ones.
pub(crate) fn propagate_shared(root: &mut Value) -> Result<()> {
    let has_inference = root.get("inference").is_some_and(|v| !v.is_null());
    for (shared, targets) in SHARED_SECTIONS {
        if get(root, shared).is_some_and(Value::is_object) {
            for target in *targets {
                if get(root, target).is_none_or(Value::is_null) {
                    set(root, target, Value::Object(serde_json::Map::new()));
                }
            }
        }
    }
    for (shared, targets) in SHARED_KEYS {
        let Some(value) = get(root, shared).cloned() else { continue };
        for target in *targets {
            if target.starts_with("inference.") && !has_inference {
                continue;
            }
            // An explicit "None" (e.g. `ckpt.keep_last = "None"`: keep every checkpoint) fills
            // parts that do not set the key, and conflicts with none.
            if value.is_null() {
                if get(root, target).is_none() {
                    set(root, target, Value::Null);
                }
                continue;
            }
            match get(root, target) {
                Some(existing) if !existing.is_null() && !same_value(existing, &value) => {
                    return Err(ConfigError::SharedConflict {
                        shared: (*shared).to_owned(),
                        target: (*target).to_owned(),
                        shared_value: value.to_string(),
                        target_value: existing.to_string(),
                    });
                }
                _ => set(root, target, value.clone()),
            }
        }
    }
    Ok(())
}

fn same_value(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

fn get<'a>(root: &'a Value, dotted: &str) -> Option<&'a Value> {
    dotted.split('.').try_fold(root, |node, key| node.get(key))
}

fn set(root: &mut Value, dotted: &str, value: Value) {
    let mut node = root;
    let keys: Vec<&str> = dotted.split('.').collect();
    for key in &keys[..keys.len() - 1] {
        if !node.is_object() {
            *node = Value::Object(serde_json::Map::new());
        }
        let map = node.as_object_mut().expect("just made an object");
        node = map.entry((*key).to_owned()).or_insert_with(|| Value::Object(serde_json::Map::new()));
        if node.is_null() {
            *node = Value::Object(serde_json::Map::new());
        }
    }
    if !node.is_object() {
        *node = Value::Object(serde_json::Map::new());
    }
    node.as_object_mut().expect("just made an object").insert(keys[keys.len() - 1].to_owned(), value);
}

/// One env server the launcher spawns.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvServerPart {
    /// `train` or `eval`.
    pub split: &'static str,
    /// The env's name (unique within its split).
    pub name: String,
    /// Its config.
    pub config: EnvServerConfig,
    /// The program to run instead of `rl env-server` (a user's env-server binary), with its first args.
    pub command: Option<Vec<String>>,
}

/// The configs of every process a resolved `RlConfig` launches.
#[derive(Debug, Clone, PartialEq)]
pub struct RlParts {
    /// The trainer.
    pub trainer: TrainerConfig,
    /// The orchestrator.
    pub orchestrator: OrchestratorConfig,
    /// The embedded inference server, if any.
    pub inference: Option<InferenceConfig>,
    /// Env servers to spawn (envs with an `address` are not spawned).
    pub env_servers: Vec<EnvServerPart>,
}

impl RlConfig {
    /// The run's name: `run.name`, or `<env names joined by +>--<model name>` (of a hub id such as
    /// `Qwen/Qwen3-0.6B` its last part: the name is one directory).
    pub fn run_name(&self) -> String {
        if let Some(name) = &self.run.name {
            return name.clone();
        }
        let envs: Vec<&str> = self.orchestrator.train.env.iter().map(|e| e.display_name()).collect();
        let envs = if envs.is_empty() { String::from("no-env") } else { envs.join("+") };
        let model = policy_model_name(&self.orchestrator.model);
        let model = model.rsplit(['/', '\\']).next().unwrap_or(&model);
        format!("{envs}--{model}").to_lowercase()
    }

    /// The run directory.
    pub fn run_dir(&self) -> PathBuf {
        self.output_dir.join(self.run_name())
    }

    /// Derives what the launcher fills in: run name, part output dirs, the policy endpoint of the
    /// embedded inference server, per-env inherited values.
    pub fn resolve(&mut self) -> Result<()> {
        // Env names go into the derived run name: blame the env's key, not `run.name`.
        for (i, e) in self.orchestrator.train.env.iter().enumerate() {
            let field = if e.name.is_some() { "name" } else { "id" };
            crate::shared::plain_name(&format!("orchestrator.train.env.{i}.{field}"), e.display_name())?;
        }
        let run_dir = self.run_dir();
        self.run.name = Some(self.run_name());
        let default_dir = PathBuf::from("outputs");
        for (key, dir) in [
            ("trainer.output_dir", &mut self.trainer.output_dir),
            ("orchestrator.output_dir", &mut self.orchestrator.output_dir),
        ] {
            if *dir != default_dir && *dir != run_dir {
                return Err(ConfigError::invalid(
                    key,
                    format!(
                        "is derived from output_dir and run.name ({}); set those instead of {}",
                        run_dir.display(),
                        dir.display()
                    ),
                ));
            }
            dir.clone_from(&run_dir);
        }
        if let Some(inference) = &mut self.inference {
            inference.output_dir.clone_from(&run_dir);
            let served = inference.base_url();
            let default_url = PolicyModelConfig::default().base_url;
            let current = &self.orchestrator.model.base_url;
            if *current == default_url || inference.port == 0 {
                self.orchestrator.model.base_url = served.into();
            } else if *current != served.as_str() {
                return Err(ConfigError::invalid(
                    "orchestrator.model.base_url",
                    format!(
                        "points at {current}, but the embedded inference server listens on {served}: drop [inference] to use an external server, or make them agree"
                    ),
                ));
            }
        }
        self.orchestrator.resolve();
        Ok(())
    }

    /// Checks every part and the rules that tie them together. Call after [`RlConfig::resolve`].
    pub fn validate(&self) -> Result<()> {
        self.run.validate("run")?;
        self.launcher.validate("launcher")?;
        crate::env_vars::validate("env_vars", &self.env_vars)?;
        if let Some(w) = &self.wandb {
            w.validate("wandb")?;
        }
        self.trainer.validate("trainer")?;
        self.orchestrator.validate("orchestrator")?;
        if let Some(inference) = &self.inference {
            inference.validate("inference")?;
        }
        if self.orchestrator.train.env.is_empty() {
            return Err(ConfigError::invalid(
                "orchestrator.train.env",
                "an RL run needs at least one training env ([[orchestrator.train.env]] with an `id`)",
            ));
        }
        if self.trainer.model.path.is_none() {
            return Err(ConfigError::invalid(
                "model.path",
                "the trainer needs starting weights: set `model.path` to a local HF-format model directory",
            ));
        }
        let paths = [
            ("orchestrator.model.path", self.orchestrator.model.path.as_ref()),
            ("inference.model.path", self.inference.as_ref().and_then(|i| i.model.path.as_ref())),
        ];
        for (key, path) in paths {
            if let Some(p) = path
                && Some(p) != self.trainer.model.path.as_ref()
            {
                return Err(ConfigError::invalid(
                    key,
                    format!(
                        "is {} but trainer.model.path is {}: all parts must use the same model",
                        p.display(),
                        self.trainer.model.path.as_ref().map(|p| p.display().to_string()).unwrap_or_default()
                    ),
                ));
            }
        }
        self.validate_lora_route()?;
        if self.launcher.inference_servers > 1 && self.inference.is_none() {
            return Err(ConfigError::invalid(
                "launcher.inference_servers",
                "starts copies of the embedded [inference] server, and there is none: add [inference], or list \
                 external servers in orchestrator.model.base_url",
            ));
        }
        if self.trainer.model.seq_len < self.orchestrator.seq_len {
            return Err(ConfigError::invalid(
                "trainer.model.seq_len",
                format!(
                    "({}) must be >= orchestrator.seq_len ({})",
                    self.trainer.model.seq_len, self.orchestrator.seq_len
                ),
            ));
        }
        if self.trainer.max_steps != self.orchestrator.max_steps {
            return Err(ConfigError::invalid(
                "max_steps",
                format!(
                    "trainer.max_steps ({:?}) and orchestrator.max_steps ({:?}) differ: set the shared `max_steps`",
                    self.trainer.max_steps, self.orchestrator.max_steps
                ),
            ));
        }
        match (&self.trainer.ckpt, &self.orchestrator.ckpt) {
            (Some(t), Some(o)) if t.interval != o.interval => {
                return Err(ConfigError::invalid(
                    "ckpt.interval",
                    format!(
                        "trainer ({}) and orchestrator ({}) checkpoint at different intervals",
                        t.interval, o.interval
                    ),
                ));
            }
            (Some(_), None) | (None, Some(_)) => {
                return Err(ConfigError::invalid(
                    "ckpt",
                    "checkpoint both trainer and orchestrator or neither: use the shared [ckpt] section",
                ));
            }
            _ => {}
        }
        if self.trainer.resume != self.orchestrator.resume {
            return Err(ConfigError::invalid(
                "resume",
                "trainer and orchestrator must resume from the same step: use the shared [resume] section",
            ));
        }
        Ok(())
    }

    /// `orchestrator.model.lora_name` (vLLM's LoRA API) needs adapters to load and a vLLM to load
    /// them into.
    fn validate_lora_route(&self) -> Result<()> {
        if self.orchestrator.model.lora_name.is_none() {
            return Ok(());
        }
        if self.trainer.lora.is_none() {
            return Err(ConfigError::invalid(
                "orchestrator.model.lora_name",
                "loads LoRA adapters through vLLM's LoRA API, but there is no [trainer.lora]: the trainer \
                 broadcasts full weights (remove lora_name, or add [trainer.lora])",
            ));
        }
        if self.inference.is_some() {
            return Err(ConfigError::invalid(
                "orchestrator.model.lora_name",
                "is for an external vLLM; the embedded [inference] server takes adapters through \
                 /update_weights (remove lora_name, or remove [inference] and serve the policy with vLLM)",
            ));
        }
        Ok(())
    }

    /// The config of every process the launcher starts.
    pub fn parts(&self) -> RlParts {
        let train = self.orchestrator.train.env.iter().map(|e| ("train", e.endpoint()));
        let eval = self.orchestrator.eval.iter().flat_map(|eval| eval.env.iter().map(|e| ("eval", e.endpoint())));
        let spawned = SpawnedEnvs {
            tokenizer: self.trainer.model.path.as_deref(),
            output_dir: self.run_dir(),
            log: &self.orchestrator.log,
        };
        let env_servers = spawned.parts(train.chain(eval));
        let mut orchestrator = self.orchestrator.clone();
        let inference = self.inference.clone().map(|mut inference| {
            // The embedded server loads weights from this run's broadcasts only, and its client
            // (the orchestrator) gets the names of its key variables.
            if inference.weight_roots.is_empty() {
                inference.weight_roots = vec![rl_run::RunDir::new(self.run_dir()).broadcasts()];
            }
            // The policy samples the plain distribution, whatever its generation_config.json says.
            inference.generation_config.get_or_insert(crate::GenerationConfigSource::Vllm);
            let m = &mut orchestrator.model;
            m.api_key_env = m.api_key_env.take().or_else(|| inference.api_key_env.clone());
            m.admin_key_env = m.admin_key_env.take().or_else(|| inference.admin_key_env.clone());
            inference
        });
        RlParts { trainer: self.trainer.clone(), orchestrator, inference, env_servers }
    }
}

impl OrchestratorConfig {
    /// The env servers `rl eval` spawns: one per eval env without an `address`, in
    /// `output_dir`, a verifiers env rendering prompts with `model.path`'s tokenizer.
    pub fn eval_env_servers(&self) -> Vec<EnvServerPart> {
        let eval = self.eval.iter().flat_map(|eval| eval.env.iter().map(|e| ("eval", e.endpoint())));
        SpawnedEnvs { tokenizer: self.model.path.as_deref(), output_dir: self.output_dir.clone(), log: &self.log }
            .parts(eval)
    }
}

/// What every spawned env server's config shares.
struct SpawnedEnvs<'a> {
    /// The policy's model directory (a verifiers env renders prompts with its tokenizer).
    tokenizer: Option<&'a std::path::Path>,
    output_dir: PathBuf,
    log: &'a LogConfig,
}

impl SpawnedEnvs<'_> {
    /// One part per env without an `address` (those are already running).
    fn parts<'e>(&self, envs: impl Iterator<Item = (&'static str, EnvEndpoint<'e>)>) -> Vec<EnvServerPart> {
        envs.filter(|(_, env)| env.address.is_none())
            .map(|(split, env)| EnvServerPart {
                split,
                name: env.display_name().to_owned(),
                command: env.command.map(<[String]>::to_vec),
                config: self.config(env),
            })
            .collect()
    }

    fn config(&self, env: EnvEndpoint<'_>) -> EnvServerConfig {
        let EnvEndpoint { id, name, args, serve, .. } = env;
        let mut args = args.clone();
        if id.replace('_', "-") == "verifiers"
            && !args.contains_key("tokenizer")
            && let Some(path) = self.tokenizer
        {
            args.insert(String::from("tokenizer"), serde_json::Value::from(path.to_string_lossy().into_owned()));
        }
        EnvServerConfig {
            env: EnvSpec { id: id.to_owned(), name: name.map(str::to_owned), args },
            serve: serve.clone(),
            output_dir: self.output_dir.clone(),
            log: self.log.clone(),
        }
    }
}

fn policy_model_name(m: &PolicyModelConfig) -> String {
    ModelConfig { path: m.path.clone(), name: m.name.clone() }.served_name()
}
