//! The builtin algorithms' config variants: one line in [`builtin_algorithms!`] per algorithm (its
//! id and fields type), its fields and their checks next to it. Ids, dispatch and the schema all
//! come from that list.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::fields::AlgorithmFields;
use super::grpo::GrpoConfig;
use crate::error::{ConfigError, Result};

/// Declares [`BuiltinAlgorithm`] from `Variant(FieldsType) = "id"` lines: the enum (tagged by
/// `id`), the list of ids and the dispatch to each variant's [`AlgorithmFields`].
macro_rules! builtin_algorithms {
    ($($(#[$doc:meta])* $variant:ident($fields:ty) = $id:literal,)*) => {
        /// A builtin algorithm and its fields.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
        #[serde(tag = "id")]
        pub enum BuiltinAlgorithm {
            $($(#[$doc])* #[serde(rename = $id)] $variant($fields),)*
        }

        impl BuiltinAlgorithm {
            /// Ids of the algorithms built into the orchestrator.
            pub const IDS: &'static [&'static str] = &[$($id),*];

            /// The algorithm's id.
            pub fn id(&self) -> &'static str {
                match self {
                    $(BuiltinAlgorithm::$variant(_) => $id,)*
                }
            }

            pub(crate) fn fields(&self) -> &dyn AlgorithmFields {
                match self {
                    $(BuiltinAlgorithm::$variant(fields) => fields,)*
                }
            }
        }
    };
}

builtin_algorithms! {
    /// Group-relative advantage: A = r - mean(r) over the group's clean traces (Dr. GRPO, prime-rl's
    /// default), or divided by the group's reward standard deviation (`scale_rewards = "group"`,
    /// DeepSeek's GRPO and TRL's default).
    Grpo(GrpoConfig) = "grpo",
    /// A = (r - m) / m with m the group mean, and 0 when m <= 0.
    MaxRl(NoFields) = "max_rl",
    /// Plain REINFORCE: A = r.
    Rl(NoFields) = "rl",
    /// Cross-entropy on the actor's tokens (needs a frozen actor: `orchestrator.actor` other than `policy`).
    Sft(SftFields) = "sft",
    /// Rejection-sampling fine-tuning (expert iteration; ReST, RAFT): cross-entropy with weight
    /// `weight` on the sampled tokens of each group's `top` best clean rollouts, of those whose
    /// reward is at least `min_reward` and above the group's mean. It moves the policy's most
    /// likely answer towards its best samples, which a policy gradient over near-equal samples
    /// does slowly; usually listed next to `grpo`.
    Rft(RftConfig) = "rft",
    /// GRPO plus cross-entropy with weight `alpha` on observation tokens of the given roles after the
    /// first sampled turn.
    Echo(EchoConfig) = "echo",
    /// On-policy distillation: reference logprobs from `model`, folded into the rl advantages.
    Opd(OpdConfig) = "opd",
    /// On-policy self-distillation: the model scored with a demonstration hint in its prompt.
    Opsd(OpsdConfig) = "opsd",
    /// Multi-agent EMA baseline per (task, example, member): update, then subtract (SPIRAL Alg. 1).
    Rae(RaeConfig) = "rae",
    /// Multi-agent GRPO for proposer-solver envs: each rollout's baseline is the mean reward of its
    /// peers — the group's rollouts of the same member, and for members in `episode_agents` only
    /// those of the same episode (A = r - mean(peers); a rollout without peers gets 0).
    HierarchicalGrpo(HierarchicalGrpoConfig) = "hierarchical_grpo",
}

/// An algorithm without fields.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoFields {}

impl AlgorithmFields for NoFields {}

/// `sft` has no fields; it imitates a frozen actor.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SftFields {}

impl AlgorithmFields for SftFields {
    fn imitates_frozen_actor(&self) -> bool {
        true
    }
}

/// Fields of `rft`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RftConfig {
    /// Rollouts imitated per group, best first.
    #[serde(default = "default_rft_top")]
    pub top: u32,
    /// Smallest reward a rollout needs to be imitated.
    #[serde(default)]
    pub min_reward: f64,
    /// Weight of the cross-entropy on its tokens.
    #[serde(default = "default_one")]
    pub weight: f64,
}

fn default_rft_top() -> u32 {
    1
}
fn default_one() -> f64 {
    1.0
}

impl AlgorithmFields for RftConfig {
    fn validate(&self, key: &str) -> Result<()> {
        if self.top == 0 {
            return Err(ConfigError::invalid(format!("{key}.top"), "must be at least 1, got 0"));
        }
        if !self.min_reward.is_finite() {
            return Err(ConfigError::invalid(
                format!("{key}.min_reward"),
                format!("must be a finite number, got {}", self.min_reward),
            ));
        }
        positive(&format!("{key}.weight"), self.weight)
    }
}

/// Message roles whose observation tokens `echo` can train.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EchoRole {
    /// Tool results.
    Tool,
    /// User / environment feedback messages.
    User,
}

/// Fields of `echo`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EchoConfig {
    /// Weight of the cross-entropy on observation tokens.
    #[serde(default = "default_echo_alpha")]
    pub alpha: f64,
    /// Roles whose observation tokens are trained (tool results and user feedback by default).
    #[serde(default = "default_echo_roles")]
    pub roles: Vec<EchoRole>,
}

fn default_echo_alpha() -> f64 {
    0.1
}
fn default_echo_roles() -> Vec<EchoRole> {
    vec![EchoRole::Tool, EchoRole::User]
}

impl AlgorithmFields for EchoConfig {
    fn validate(&self, key: &str) -> Result<()> {
        positive(&format!("{key}.alpha"), self.alpha)?;
        if self.roles.is_empty() {
            return Err(ConfigError::invalid(format!("{key}.roles"), "must name at least one role"));
        }
        Ok(())
    }
}

/// Fields of `opd`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpdConfig {
    /// Key of the reference model under `orchestrator.models` (must have `tokens = true`).
    #[serde(default = "default_reference")]
    pub model: String,
    /// Most scoring requests in flight at once.
    #[serde(default = "default_max_concurrent")]
    pub max_concurrent: u32,
}

fn default_reference() -> String {
    String::from("reference")
}
fn default_max_concurrent() -> u32 {
    32
}

impl AlgorithmFields for OpdConfig {
    fn validate(&self, key: &str) -> Result<()> {
        at_least_one(&format!("{key}.max_concurrent"), self.max_concurrent)
    }

    fn model_key(&self) -> Option<&str> {
        Some(&self.model)
    }
}

/// Fields of `opsd`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpsdConfig {
    /// Key of the scoring model (`policy` scores with the trained model itself).
    #[serde(default = "default_policy")]
    pub model: String,
    /// Task-info field holding the demonstration.
    #[serde(default = "default_demo_key")]
    pub demo_key: String,
    /// Template of the hint; `{demonstration}` is replaced by the demonstration.
    #[serde(default = "default_opsd_template")]
    pub template: String,
    /// Most scoring requests in flight at once.
    #[serde(default = "default_max_concurrent")]
    pub max_concurrent: u32,
}

fn default_policy() -> String {
    String::from(crate::POLICY_KEY)
}
fn default_demo_key() -> String {
    String::from("demonstration")
}
fn default_opsd_template() -> String {
    String::from("Here is an example of an expert response:\n<demonstration>\n{demonstration}\n</demonstration>")
}

impl AlgorithmFields for OpsdConfig {
    fn validate(&self, key: &str) -> Result<()> {
        at_least_one(&format!("{key}.max_concurrent"), self.max_concurrent)
    }

    fn model_key(&self) -> Option<&str> {
        Some(&self.model)
    }
}

/// Fields of `rae`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RaeConfig {
    /// EMA momentum of the baseline, in [0, 1).
    #[serde(default = "default_momentum")]
    pub momentum: f64,
    /// Drop the judge member's trajectories from training.
    #[serde(default = "default_true")]
    pub drop_judge: bool,
}

fn default_momentum() -> f64 {
    0.9
}
fn default_true() -> bool {
    true
}

impl AlgorithmFields for RaeConfig {
    fn validate(&self, key: &str) -> Result<()> {
        if !(0.0..1.0).contains(&self.momentum) {
            return Err(ConfigError::invalid(
                format!("{key}.momentum"),
                format!("must be in [0, 1), got {}", self.momentum),
            ));
        }
        Ok(())
    }
}

/// Fields of `hierarchical_grpo`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HierarchicalGrpoConfig {
    /// Members compared only within their episode (e.g. the solvers of one proposed task).
    pub episode_agents: Vec<String>,
}

impl AlgorithmFields for HierarchicalGrpoConfig {
    fn validate(&self, key: &str) -> Result<()> {
        if self.episode_agents.is_empty() || self.episode_agents.iter().any(|a| a.trim().is_empty()) {
            return Err(ConfigError::invalid(
                format!("{key}.episode_agents"),
                "must name at least one member (non-empty ids)",
            ));
        }
        Ok(())
    }
}

fn positive(key: &str, value: f64) -> Result<()> {
    if !(value.is_finite() && value > 0.0) {
        return Err(ConfigError::invalid(key, format!("must be > 0, got {value}")));
    }
    Ok(())
}

fn at_least_one(key: &str, value: u32) -> Result<()> {
    if value == 0 {
        return Err(ConfigError::invalid(key, "must be at least 1, got 0"));
    }
    Ok(())
}
