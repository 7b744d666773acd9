//! Algorithm selection: `["grpo"]` or `[[orchestrator.algorithms]]` tables; builtin ids are typed,
//! unknown ids are env-owned and keep their fields for the env server's `RunAlgorithms`.

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{ConfigError, Result};
use crate::shared::Table;

/// Ids of the algorithms built into the orchestrator.
pub const BUILTIN_IDS: &[&str] =
    &["grpo", "max_rl", "rl", "sft", "rft", "echo", "opd", "opsd", "rae", "hierarchical_grpo"];

/// Which loss channel of the trainer an algorithm writes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LossChannel {
    /// Policy-gradient loss with advantages.
    Rl,
    /// Cross-entropy (supervised) loss with weights.
    Ce,
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

/// How `grpo` scales group-relative advantages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RewardScaling {
    /// A = r - mean(r).
    #[default]
    None,
    /// A = (r - mean(r)) / (std(r) + 1e-4): near-identical rewards in a group still make a full-size
    /// signal (and so does their noise).
    Group,
}

/// What `grpo` subtracts from each reward.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Baseline {
    /// The mean reward of the group's clean rollouts.
    #[default]
    Group,
    /// The reward of one extra greedy (temperature 0) rollout of the same task, run beside the group
    /// and not trained (self-critical sequence training, Rennie et al. 2017; ReMax, Li et al.
    /// 2023): only samples that beat the policy's greedy answer are pushed up, and samples worse
    /// than it but above the group mean are pushed down, so the update moves the mode that greedy
    /// decoding returns. With `credit = "turn"` each turn is compared with the greedy rollout's same
    /// turn. Costs one generation per group; a group whose greedy rollout failed falls back to the
    /// group mean. With `scale_rewards = "group"` the std is taken over the samples and the greedy
    /// reward together.
    Greedy,
}

/// Which tokens `grpo` credits with which reward.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Credit {
    /// Every sampled token gets the episode's advantage.
    #[default]
    Episode,
    /// Each model turn's tokens get the advantage of that turn's reward-to-go (the rewards of this
    /// turn and the later ones, divided by the number of turns, as the episode reward is their
    /// mean), against the same turn of the group's other rollouts: a turn is not blamed for an
    /// earlier turn's mistake. Needs an env that reports per-turn rewards (`Trace.turn_rewards`).
    Turn,
}

/// A builtin algorithm and its fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "id", rename_all = "snake_case", deny_unknown_fields)]
pub enum BuiltinAlgorithm {
    /// Group-relative advantage: A = r - mean(r) over the group's clean traces (Dr. GRPO, prime-rl's
    /// default), or divided by the group's reward standard deviation (`scale_rewards = "group"`,
    /// DeepSeek's GRPO and TRL's default).
    Grpo {
        /// How advantages are scaled: `none` (A = r - mean) or `group` (A = (r - mean) / (std + 1e-4)).
        #[serde(default)]
        scale_rewards: RewardScaling,
        /// Which reward each token is credited with: `episode` (the episode's, on every sampled
        /// token) or `turn` (each model turn's reward-to-go; multi-turn envs reporting per-turn
        /// rewards).
        #[serde(default)]
        credit: Credit,
        /// With `credit = "turn"`: how much a turn's advantage counts the later turns' rewards,
        /// `G_k = (r_k + d r_{k+1} + d^2 r_{k+2} + ...) / n`. 1 (the default) is the plain
        /// reward-to-go; 0 credits each turn with its own reward only, for episodes whose turns
        /// are scored independently (less variance, biased where an answer shapes later turns).
        #[serde(default = "default_turn_discount")]
        turn_discount: f64,
        /// Optimise the expected best reward of `best_of` samples instead of the mean reward (PKPO's
        /// max@k, Walder & Karkhanis 2025): each reward is replaced by its unbiased max@k gradient
        /// weight before the baseline. A sample is then credited for being the best of the subsets
        /// it is in, so a group's rare best answer gains more and the near-misses beside it are
        /// pushed down less: the policy keeps exploring instead of sharpening onto its current
        /// answer. 1 (the default) is plain grpo; at most the group size.
        #[serde(default = "default_best_of")]
        best_of: u32,
        /// With `best_of > 1`: use it for training steps 1..=`best_of_steps` only, then plain grpo
        /// (PKPO's annealing of k: explore with max@k, then sharpen the policy's most likely
        /// answer, which greedy decoding returns). Unset: `best_of` throughout.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        best_of_steps: Option<u64>,
        /// What each reward is compared with: `group` (the group's mean, the default) or `greedy`
        /// (the reward of a greedy rollout of the same task, run beside the group: the update
        /// aims at the answer greedy decoding gives).
        #[serde(default)]
        baseline: Baseline,
    },
    /// A = (r - m) / m with m the group mean, and 0 when m <= 0.
    MaxRl {},
    /// Plain REINFORCE: A = r.
    Rl {},
    /// Cross-entropy on the actor's tokens (needs a frozen actor: `orchestrator.actor` other than `policy`).
    Sft {},
    /// Rejection-sampling fine-tuning (expert iteration; ReST, RAFT): cross-entropy with weight
    /// `weight` on the sampled tokens of each group's `top` best clean rollouts, of those whose
    /// reward is at least `min_reward` and above the group's mean. It moves the policy's most
    /// likely answer towards its best samples, which a policy gradient over near-equal samples
    /// does slowly; usually listed next to `grpo`.
    Rft {
        /// Rollouts imitated per group, best first.
        #[serde(default = "default_rft_top")]
        top: u32,
        /// Smallest reward a rollout needs to be imitated.
        #[serde(default)]
        min_reward: f64,
        /// Weight of the cross-entropy on its tokens.
        #[serde(default = "default_rft_weight")]
        weight: f64,
    },
    /// GRPO plus cross-entropy with weight `alpha` on observation tokens of the given roles after the
    /// first sampled turn.
    Echo {
        /// Weight of the cross-entropy on observation tokens.
        #[serde(default = "default_echo_alpha")]
        alpha: f64,
        /// Roles whose observation tokens are trained (tool results and user feedback by default).
        #[serde(default = "default_echo_roles")]
        roles: Vec<EchoRole>,
    },
    /// On-policy distillation: reference logprobs from `model`, folded into the rl advantages.
    Opd {
        /// Key of the reference model under `orchestrator.models` (must have `tokens = true`).
        #[serde(default = "default_reference")]
        model: String,
        /// Most scoring requests in flight at once.
        #[serde(default = "default_max_concurrent")]
        max_concurrent: u32,
    },
    /// On-policy self-distillation: the model scored with a demonstration hint in its prompt.
    Opsd {
        /// Key of the scoring model (`policy` scores with the trained model itself).
        #[serde(default = "default_policy")]
        model: String,
        /// Task-info field holding the demonstration.
        #[serde(default = "default_demo_key")]
        demo_key: String,
        /// Template of the hint; `{demonstration}` is replaced by the demonstration.
        #[serde(default = "default_opsd_template")]
        template: String,
        /// Most scoring requests in flight at once.
        #[serde(default = "default_max_concurrent")]
        max_concurrent: u32,
    },
    /// Multi-agent EMA baseline per (task, example, member): update, then subtract (SPIRAL Alg. 1).
    Rae {
        /// EMA momentum of the baseline, in [0, 1).
        #[serde(default = "default_momentum")]
        momentum: f64,
        /// Drop the judge member's trajectories from training.
        #[serde(default = "default_true")]
        drop_judge: bool,
    },
    /// Multi-agent GRPO for proposer-solver envs: each rollout's baseline is the mean reward of its
    /// peers — the group's rollouts of the same member, and for members in `episode_agents` only
    /// those of the same episode (A = r - mean(peers); a rollout without peers gets 0).
    HierarchicalGrpo {
        /// Members compared only within their episode (e.g. the solvers of one proposed task).
        episode_agents: Vec<String>,
    },
}

fn default_turn_discount() -> f64 {
    1.0
}

fn default_best_of() -> u32 {
    1
}

fn default_rft_top() -> u32 {
    1
}
fn default_rft_weight() -> f64 {
    1.0
}
fn default_echo_alpha() -> f64 {
    0.1
}
fn default_echo_roles() -> Vec<EchoRole> {
    vec![EchoRole::Tool, EchoRole::User]
}
fn default_reference() -> String {
    String::from("reference")
}
fn default_policy() -> String {
    String::from("policy")
}
fn default_max_concurrent() -> u32 {
    32
}
fn default_demo_key() -> String {
    String::from("demonstration")
}
fn default_opsd_template() -> String {
    String::from("Here is an example of an expert response:\n<demonstration>\n{demonstration}\n</demonstration>")
}
fn default_momentum() -> f64 {
    0.9
}
fn default_true() -> bool {
    true
}

/// One selected algorithm: a builtin, or an env-owned one run on the env server.
#[derive(Debug, Clone, PartialEq)]
pub enum AlgorithmConfig {
    /// Built into the orchestrator.
    Builtin(BuiltinAlgorithm),
    /// Unknown to the orchestrator: sent to the env's server with `RunAlgorithms`.
    EnvOwned {
        /// The algorithm id the env server knows.
        id: String,
        /// Its fields, passed through unchanged.
        fields: Table,
    },
}

impl AlgorithmConfig {
    /// The algorithm's id.
    pub fn id(&self) -> &str {
        match self {
            AlgorithmConfig::Builtin(b) => b.id(),
            AlgorithmConfig::EnvOwned { id, .. } => id,
        }
    }

    /// A builtin with its defaults, or an env-owned id without fields.
    pub fn from_id(id: &str) -> Self {
        let value = serde_json::json!({ "id": id });
        match serde_json::from_value::<BuiltinAlgorithm>(value) {
            Ok(b) => AlgorithmConfig::Builtin(b),
            Err(_) => AlgorithmConfig::EnvOwned { id: id.to_owned(), fields: Table::new() },
        }
    }

    /// Checks field ranges; `key` is the dotted path of this entry.
    pub fn validate(&self, key: &str) -> Result<()> {
        match self {
            AlgorithmConfig::Builtin(BuiltinAlgorithm::Echo { alpha, roles }) => {
                if !(alpha.is_finite() && *alpha > 0.0) {
                    return Err(ConfigError::invalid(format!("{key}.alpha"), format!("must be > 0, got {alpha}")));
                }
                if roles.is_empty() {
                    return Err(ConfigError::invalid(format!("{key}.roles"), "must name at least one role"));
                }
            }
            AlgorithmConfig::Builtin(BuiltinAlgorithm::Grpo {
                credit,
                turn_discount,
                best_of,
                best_of_steps,
                baseline,
                ..
            }) => {
                if *best_of == 0 {
                    return Err(ConfigError::invalid(format!("{key}.best_of"), "must be at least 1, got 0"));
                }
                if *best_of > 1 && *baseline == Baseline::Greedy {
                    return Err(ConfigError::invalid(
                        format!("{key}.baseline"),
                        "`greedy` compares each reward with the greedy rollout's, and `best_of` replaces the \
                         rewards by max@k weights, which are not comparable with it: use one of the two",
                    ));
                }
                if let Some(steps) = best_of_steps {
                    if *best_of == 1 {
                        return Err(ConfigError::invalid(
                            format!("{key}.best_of_steps"),
                            "limits the steps of `best_of`, which is 1 (plain grpo): set `best_of` above 1",
                        ));
                    }
                    if *steps == 0 {
                        return Err(ConfigError::invalid(format!("{key}.best_of_steps"), "must be at least 1, got 0"));
                    }
                }
                if !(0.0..=1.0).contains(turn_discount) {
                    return Err(ConfigError::invalid(
                        format!("{key}.turn_discount"),
                        format!("must be in [0, 1], got {turn_discount}"),
                    ));
                }
                if *credit == Credit::Episode && *turn_discount != 1.0 {
                    return Err(ConfigError::invalid(
                        format!("{key}.turn_discount"),
                        "discounts turn rewards, so it needs `credit = \"turn\"`",
                    ));
                }
            }
            AlgorithmConfig::Builtin(BuiltinAlgorithm::Rft { top, min_reward, weight }) => {
                if *top == 0 {
                    return Err(ConfigError::invalid(format!("{key}.top"), "must be at least 1, got 0"));
                }
                if !min_reward.is_finite() {
                    return Err(ConfigError::invalid(
                        format!("{key}.min_reward"),
                        format!("must be a finite number, got {min_reward}"),
                    ));
                }
                if !(weight.is_finite() && *weight > 0.0) {
                    return Err(ConfigError::invalid(format!("{key}.weight"), format!("must be > 0, got {weight}")));
                }
            }
            AlgorithmConfig::Builtin(
                BuiltinAlgorithm::Opd { max_concurrent, .. } | BuiltinAlgorithm::Opsd { max_concurrent, .. },
            ) if *max_concurrent == 0 => {
                return Err(ConfigError::invalid(format!("{key}.max_concurrent"), "must be at least 1, got 0"));
            }
            AlgorithmConfig::Builtin(BuiltinAlgorithm::Rae { momentum, .. }) if !(0.0..1.0).contains(momentum) => {
                return Err(ConfigError::invalid(
                    format!("{key}.momentum"),
                    format!("must be in [0, 1), got {momentum}"),
                ));
            }
            AlgorithmConfig::Builtin(BuiltinAlgorithm::HierarchicalGrpo { episode_agents })
                if episode_agents.is_empty() || episode_agents.iter().any(|a| a.trim().is_empty()) =>
            {
                return Err(ConfigError::invalid(
                    format!("{key}.episode_agents"),
                    "must name at least one member (non-empty ids)",
                ));
            }
            AlgorithmConfig::EnvOwned { id, .. } if id.trim().is_empty() => {
                return Err(ConfigError::invalid(format!("{key}.id"), "must not be empty"));
            }
            AlgorithmConfig::EnvOwned { fields, .. } if fields.contains_key("id") => {
                return Err(ConfigError::invalid(
                    format!("{key}.id"),
                    "`id` names the algorithm; it cannot also be one of its fields",
                ));
            }
            _ => {}
        }
        Ok(())
    }

    /// The model key this algorithm scores with, if any.
    pub fn model_key(&self) -> Option<&str> {
        match self {
            AlgorithmConfig::Builtin(BuiltinAlgorithm::Opd { model, .. } | BuiltinAlgorithm::Opsd { model, .. }) => {
                Some(model)
            }
            _ => None,
        }
    }
}

impl BuiltinAlgorithm {
    /// The algorithm's id.
    pub fn id(&self) -> &'static str {
        match self {
            BuiltinAlgorithm::Grpo { .. } => "grpo",
            BuiltinAlgorithm::MaxRl {} => "max_rl",
            BuiltinAlgorithm::Rl {} => "rl",
            BuiltinAlgorithm::Sft {} => "sft",
            BuiltinAlgorithm::Rft { .. } => "rft",
            BuiltinAlgorithm::Echo { .. } => "echo",
            BuiltinAlgorithm::Opd { .. } => "opd",
            BuiltinAlgorithm::Opsd { .. } => "opsd",
            BuiltinAlgorithm::Rae { .. } => "rae",
            BuiltinAlgorithm::HierarchicalGrpo { .. } => "hierarchical_grpo",
        }
    }
}

impl Serialize for AlgorithmConfig {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            AlgorithmConfig::Builtin(b) => b.serialize(serializer),
            AlgorithmConfig::EnvOwned { id, fields } => {
                let mut map = fields.clone();
                map.insert(String::from("id"), serde_json::Value::String(id.clone()));
                map.serialize(serializer)
            }
        }
    }
}

impl<'de> Deserialize<'de> for AlgorithmConfig {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(deserializer)?;
        let mut map = match value {
            serde_json::Value::String(id) => {
                let mut m = serde_json::Map::new();
                m.insert(String::from("id"), serde_json::Value::String(id));
                m
            }
            serde_json::Value::Object(m) => m,
            other => {
                return Err(D::Error::custom(format!(
                    "invalid type: {}, expected an algorithm id string or a table with `id`",
                    describe(&other)
                )));
            }
        };
        let id = match map.get("id") {
            Some(serde_json::Value::String(id)) => id.clone(),
            Some(other) => {
                return Err(D::Error::custom(format!("invalid type: {}, expected an id string", describe(other))));
            }
            None => return Err(D::Error::missing_field("id")),
        };
        if BUILTIN_IDS.contains(&id.as_str()) {
            let builtin = serde_json::from_value::<BuiltinAlgorithm>(serde_json::Value::Object(map))
                .map_err(|e| D::Error::custom(e.to_string()))?;
            return Ok(AlgorithmConfig::Builtin(builtin));
        }
        map.remove("id");
        Ok(AlgorithmConfig::EnvOwned { id, fields: map.into_iter().collect() })
    }
}

impl JsonSchema for AlgorithmConfig {
    fn schema_name() -> Cow<'static, str> {
        Cow::Borrowed("AlgorithmConfig")
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let builtin = generator.subschema_for::<BuiltinAlgorithm>();
        json_schema!({
            "description": "An algorithm: a builtin id as a string, a builtin table with its fields, or an env-owned id (any other id, with free fields, run on the env server).",
            "anyOf": [
                { "type": "string", "description": "An algorithm id with default fields." },
                builtin,
                {
                    "type": "object",
                    "description": "An env-owned algorithm: fields are passed to the env server unchanged.",
                    "properties": { "id": { "type": "string" } },
                    "required": ["id"],
                    "additionalProperties": true
                }
            ]
        })
    }
}

/// Short description of a JSON value's type for error messages.
pub(crate) fn describe(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Null => String::from("null"),
        serde_json::Value::Bool(b) => format!("boolean `{b}`"),
        serde_json::Value::Number(n) => format!("number `{n}`"),
        serde_json::Value::String(s) => format!("string {s:?}"),
        serde_json::Value::Array(_) => String::from("a list"),
        serde_json::Value::Object(_) => String::from("a table"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: serde_json::Value) -> std::result::Result<AlgorithmConfig, String> {
        serde_json::from_value(v).map_err(|e| e.to_string())
    }

    #[test]
    fn string_and_table_forms_agree() {
        let a = parse(serde_json::json!("echo")).unwrap();
        let b = parse(serde_json::json!({"id": "echo"})).unwrap();
        assert_eq!(a, b);
        assert_eq!(
            a,
            AlgorithmConfig::Builtin(BuiltinAlgorithm::Echo {
                alpha: 0.1,
                roles: vec![EchoRole::Tool, EchoRole::User]
            })
        );
    }

    #[test]
    fn builtin_rejects_fields_of_other_algorithms() {
        let err = parse(serde_json::json!({"id": "grpo", "alpha": 0.3})).unwrap_err();
        assert!(err.contains("unknown field `alpha`"), "{err}");
    }

    #[test]
    fn unknown_ids_are_env_owned_and_round_trip() {
        let v = serde_json::json!({"id": "my_env_algo", "beta": 2, "mode": "x"});
        let a = parse(v.clone()).unwrap();
        match &a {
            AlgorithmConfig::EnvOwned { id, fields } => {
                assert_eq!(id, "my_env_algo");
                assert_eq!(fields.get("beta"), Some(&serde_json::json!(2)));
            }
            other => panic!("expected env-owned, got {other:?}"),
        }
        assert_eq!(serde_json::to_value(&a).unwrap(), v);
    }

    #[test]
    fn rae_momentum_range_is_checked() {
        let a = parse(serde_json::json!({"id": "rae", "momentum": 1.0})).unwrap();
        assert!(a.validate("orchestrator.algorithms.0").unwrap_err().to_string().contains("momentum"));
    }
}
