//! `TrainerConfig`: model, device, loss, optimizer, learning-rate schedule, checkpoints.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};

use crate::error::{ConfigError, Result};
use crate::lora::LoraConfig;
use crate::shared::{CkptConfig, Device, Dtype, LogConfig, ResumeConfig, positive, seconds};
use crate::tagged::with_default_tag;

/// Trainer: waits for each step's batch, computes the RL loss, updates and broadcasts weights.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TrainerConfig {
    /// The model trained.
    pub model: TrainerModelConfig,
    /// Where to train.
    pub device: Device,
    /// Precision of the forward and backward passes (bf16 on a GPU); the weights and the optimizer
    /// state stay f32 (master weights), cast at each use.
    pub dtype: Dtype,
    /// RL loss settings.
    pub loss: LossConfig,
    /// Optimizer.
    #[serde(deserialize_with = "optim_default_tag")]
    pub optim: OptimConfig,
    /// Learning-rate schedule.
    #[serde(deserialize_with = "scheduler_default_tag")]
    pub scheduler: SchedulerConfig,
    /// Dtype of the weights the trainer broadcasts after each step (unset: the f32 master
    /// weights). Set `bf16` when an external engine (vLLM) serves the policy in bf16: it halves
    /// the bytes written and read per step, and the engine would round to bf16 anyway. Our own
    /// inference server reads any float dtype, but bf16 weights widen its mismatch with the trainer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub broadcast_dtype: Option<Dtype>,
    /// Low-rank adapters: train only them over the frozen base weights, and broadcast only them
    /// (off when unset: full fine-tuning).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraConfig>,
    /// Number of training steps (unset: run until stopped).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u64>,
    /// How long to wait for a step's batch before failing, in seconds.
    pub batch_timeout_s: f64,
    /// Seed for anything random in the trainer (the adapters' initialisation, their dropout masks).
    pub seed: u64,
    /// Checkpoints (weights, optimizer, scheduler, progress); off when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ckpt: Option<CkptConfig>,
    /// Resume from a checkpoint; off when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resume: Option<ResumeConfig>,
    /// The run directory (rollouts are read from and broadcasts written to it).
    pub output_dir: PathBuf,
    /// Logging.
    pub log: LogConfig,
}

impl Default for TrainerConfig {
    fn default() -> Self {
        TrainerConfig {
            model: TrainerModelConfig::default(),
            device: Device::Cpu,
            dtype: Dtype::F32,
            loss: LossConfig::default(),
            optim: OptimConfig::default(),
            scheduler: SchedulerConfig::default(),
            broadcast_dtype: None,
            lora: None,
            max_steps: None,
            batch_timeout_s: 1800.0,
            seed: 0,
            ckpt: None,
            resume: None,
            output_dir: PathBuf::from("outputs"),
            log: LogConfig::default(),
        }
    }
}

/// The trained model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TrainerModelConfig {
    /// Local HF-format directory of the starting weights.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// Served model name (default: the directory's last component).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Maximum sequence length the trainer accepts (at least the orchestrator's `seq_len`).
    pub seq_len: u32,
}

impl Default for TrainerModelConfig {
    fn default() -> Self {
        TrainerModelConfig { path: None, name: None, seq_len: 2048 }
    }
}

/// The RL loss component (see docs/configuration.md for the formula).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct LossConfig {
    /// Mask tokens with A <= 0 whose probability fell by more than this (p - p_inference < -mask_low).
    pub mask_low: f64,
    /// Mask tokens with A > 0 whose probability rose by more than this (p - p_inference > mask_high).
    pub mask_high: f64,
    /// Weight of the `(lp - lp_inference)^2` KL penalty.
    pub kl_tau: f64,
    /// Scale applied to advantages.
    pub adv_tau: f64,
}

impl Default for LossConfig {
    fn default() -> Self {
        LossConfig { mask_low: 0.2, mask_high: 0.2, kl_tau: 1e-3, adv_tau: 1.0 }
    }
}

/// Optimizer (`type = "adamw"` or `"sgd"`; omit `type` for AdamW).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum OptimConfig {
    /// AdamW with decoupled weight decay and bias correction.
    Adamw {
        /// Peak learning rate. The default, 1e-6 (prime-rl's, for fine-tuning models of billions of
        /// parameters), barely moves a small or freshly initialised model: set it for one (1e-4 to
        /// 3e-4 for the `tiny` and `small` presets).
        #[serde(default = "default_lr")]
        lr: f64,
        /// Decoupled weight decay.
        #[serde(default = "default_wd")]
        weight_decay: f64,
        /// (beta1, beta2).
        #[serde(default = "default_betas")]
        betas: [f64; 2],
        /// Denominator epsilon.
        #[serde(default = "default_eps")]
        eps: f64,
        /// Global gradient-norm clip; 0 disables clipping.
        #[serde(default = "default_max_norm")]
        max_norm: f64,
    },
    /// SGD with momentum.
    Sgd {
        /// Peak learning rate. The default, 1e-6 (prime-rl's, for fine-tuning models of billions of
        /// parameters), barely moves a small or freshly initialised model: set it for one (1e-4 to
        /// 3e-4 for the `tiny` and `small` presets).
        #[serde(default = "default_lr")]
        lr: f64,
        /// Momentum.
        #[serde(default = "default_momentum")]
        momentum: f64,
        /// Nesterov momentum.
        #[serde(default = "default_true")]
        nesterov: bool,
        /// Weight decay.
        #[serde(default)]
        weight_decay: f64,
        /// Global gradient-norm clip; 0 disables clipping.
        #[serde(default = "default_max_norm")]
        max_norm: f64,
    },
}

impl Default for OptimConfig {
    fn default() -> Self {
        OptimConfig::Adamw {
            lr: default_lr(),
            weight_decay: default_wd(),
            betas: default_betas(),
            eps: default_eps(),
            max_norm: default_max_norm(),
        }
    }
}

impl OptimConfig {
    /// The global gradient-norm clip, if clipping is on.
    pub fn max_norm(&self) -> Option<f64> {
        match self {
            OptimConfig::Adamw { max_norm, .. } | OptimConfig::Sgd { max_norm, .. } => {
                Some(*max_norm).filter(|n| *n > 0.0)
            }
        }
    }

    /// The peak learning rate.
    pub fn lr(&self) -> f64 {
        match self {
            OptimConfig::Adamw { lr, .. } | OptimConfig::Sgd { lr, .. } => *lr,
        }
    }

    /// Checks ranges; `key` is the dotted path of this section.
    pub fn validate(&self, key: &str) -> Result<()> {
        positive(&format!("{key}.lr"), self.lr())?;
        let (wd, max_norm) = match self {
            OptimConfig::Adamw { weight_decay, betas, eps, max_norm, .. } => {
                for (i, b) in betas.iter().enumerate() {
                    if !(0.0..1.0).contains(b) {
                        return Err(ConfigError::invalid(
                            format!("{key}.betas.{i}"),
                            format!("must be in [0, 1), got {b}"),
                        ));
                    }
                }
                positive(&format!("{key}.eps"), *eps)?;
                (*weight_decay, *max_norm)
            }
            OptimConfig::Sgd { weight_decay, momentum, max_norm, .. } => {
                if !(0.0..1.0).contains(momentum) {
                    return Err(ConfigError::invalid(
                        format!("{key}.momentum"),
                        format!("must be in [0, 1), got {momentum}"),
                    ));
                }
                (*weight_decay, *max_norm)
            }
        };
        if !(wd.is_finite() && wd >= 0.0) {
            return Err(ConfigError::invalid(format!("{key}.weight_decay"), format!("must be >= 0, got {wd}")));
        }
        if !(max_norm.is_finite() && max_norm >= 0.0) {
            return Err(ConfigError::invalid(
                format!("{key}.max_norm"),
                format!("must be >= 0 (0 disables clipping), got {max_norm}"),
            ));
        }
        Ok(())
    }
}

fn default_lr() -> f64 {
    1e-6
}
fn default_wd() -> f64 {
    0.01
}
fn default_betas() -> [f64; 2] {
    [0.9, 0.999]
}
fn default_eps() -> f64 {
    1e-8
}
fn default_max_norm() -> f64 {
    1.0
}
fn default_momentum() -> f64 {
    0.9
}
fn default_true() -> bool {
    true
}

/// Learning-rate schedule (`type = "constant" | "linear" | "cosine"`; omit `type` for constant).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum SchedulerConfig {
    /// Linear warmup, then the peak rate.
    Constant {
        /// Steps of linear warmup from 0.
        #[serde(default)]
        warmup_steps: u64,
    },
    /// Linear warmup, the peak rate, then linear decay to `min_lr` over the last `decay_steps`
    /// steps before `max_steps` (prime-rl's warmup-stable-decay).
    Linear {
        /// Steps of linear warmup from 0.
        #[serde(default = "default_warmup")]
        warmup_steps: u64,
        /// Steps of decay, the last ones before `max_steps` (unset: every step after warmup).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        decay_steps: Option<u64>,
        /// Final learning rate.
        #[serde(default)]
        min_lr: f64,
    },
    /// Linear warmup, then cosine decay to `min_lr` at `max_steps`.
    Cosine {
        /// Steps of linear warmup from 0.
        #[serde(default = "default_warmup")]
        warmup_steps: u64,
        /// Final learning rate.
        #[serde(default)]
        min_lr: f64,
    },
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig::Constant { warmup_steps: 0 }
    }
}

impl SchedulerConfig {
    /// Checks the schedule against the optimizer and the step budget.
    pub fn validate(&self, key: &str, lr: f64, max_steps: Option<u64>) -> Result<()> {
        let (warmup, min_lr, needs_end) = match self {
            SchedulerConfig::Constant { warmup_steps } => (*warmup_steps, 0.0, false),
            SchedulerConfig::Linear { warmup_steps, decay_steps, min_lr } => {
                (*warmup_steps, *min_lr, decay_steps.is_none())
            }
            SchedulerConfig::Cosine { warmup_steps, min_lr } => (*warmup_steps, *min_lr, true),
        };
        if !(min_lr.is_finite() && min_lr >= 0.0 && min_lr <= lr) {
            return Err(ConfigError::invalid(
                format!("{key}.min_lr"),
                format!("must be in [0, lr = {lr}], got {min_lr}"),
            ));
        }
        match max_steps {
            Some(max) if warmup > max => Err(ConfigError::invalid(
                format!("{key}.warmup_steps"),
                format!("warmup ({warmup} steps) is longer than max_steps ({max})"),
            )),
            None if needs_end => Err(ConfigError::invalid(
                key,
                "this schedule decays until max_steps: set max_steps (or decay_steps for linear)",
            )),
            _ => Ok(()),
        }
    }
}

fn default_warmup() -> u64 {
    10
}

pub(crate) fn optim_default_tag<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<OptimConfig, D::Error> {
    with_default_tag(d, "adamw")
}

pub(crate) fn scheduler_default_tag<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<SchedulerConfig, D::Error> {
    with_default_tag(d, "constant")
}

impl TrainerConfig {
    /// Checks every rule that involves only the trainer; `key` is the dotted path of this section.
    pub fn validate(&self, key: &str) -> Result<()> {
        let k = |s: &str| if key.is_empty() { s.to_owned() } else { format!("{key}.{s}") };
        if self.model.seq_len < 8 {
            return Err(ConfigError::invalid(
                k("model.seq_len"),
                format!("must be at least 8, got {}", self.model.seq_len),
            ));
        }
        for (name, v) in [("mask_low", self.loss.mask_low), ("mask_high", self.loss.mask_high)] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(ConfigError::invalid(k(&format!("loss.{name}")), format!("must be >= 0, got {v}")));
            }
        }
        if !(self.loss.kl_tau.is_finite() && self.loss.kl_tau >= 0.0) {
            return Err(ConfigError::invalid(k("loss.kl_tau"), format!("must be >= 0, got {}", self.loss.kl_tau)));
        }
        positive(&k("loss.adv_tau"), self.loss.adv_tau)?;
        self.optim.validate(&k("optim"))?;
        self.scheduler.validate(&k("scheduler"), self.optim.lr(), self.max_steps)?;
        if let Some(l) = &self.lora {
            l.validate(&k("lora"))?;
        }
        if self.max_steps == Some(0) {
            return Err(ConfigError::invalid(k("max_steps"), "must be at least 1 (or unset), got 0"));
        }
        seconds(&k("batch_timeout_s"), self.batch_timeout_s)?;
        if let Some(c) = &self.ckpt {
            c.validate(&k("ckpt"))?;
        }
        if let Some(r) = &self.resume {
            r.validate(&k("resume"))?;
        }
        Ok(())
    }
}
