//! Algorithm selection: `["grpo"]` or `[[orchestrator.algorithms]]` tables; builtin ids are typed,
//! unknown ids are env-owned and keep their fields for the env server's `RunAlgorithms`. Adding a
//! builtin is its line and fields in `builtin.rs` (larger ones in a file of their own, as `grpo.rs`).

mod builtin;
mod fields;
mod grpo;

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub use builtin::{
    BuiltinAlgorithm, EchoConfig, EchoRole, HierarchicalGrpoConfig, NoFields, OpdConfig, OpsdConfig, RaeConfig,
    RftConfig, SftFields,
};
pub use grpo::{Baseline, Credit, GrpoConfig, RewardScaling};

use crate::error::{ConfigError, Result};
use crate::shared::Table;

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
            AlgorithmConfig::Builtin(b) => b.fields().validate(key),
            AlgorithmConfig::EnvOwned { id, .. } if id.trim().is_empty() => {
                Err(ConfigError::invalid(format!("{key}.id"), "must not be empty"))
            }
            AlgorithmConfig::EnvOwned { fields, .. } if fields.contains_key("id") => Err(ConfigError::invalid(
                format!("{key}.id"),
                "`id` names the algorithm; it cannot also be one of its fields",
            )),
            AlgorithmConfig::EnvOwned { .. } => Ok(()),
        }
    }

    /// Checks the fields against the group size of the env it runs on (`env`: its display name).
    pub fn validate_group(&self, key: &str, group: u32, env: &str) -> Result<()> {
        match self {
            AlgorithmConfig::Builtin(b) => b.fields().validate_group(key, group, env),
            AlgorithmConfig::EnvOwned { .. } => Ok(()),
        }
    }

    /// The model key this algorithm scores with, if any.
    pub fn model_key(&self) -> Option<&str> {
        match self {
            AlgorithmConfig::Builtin(b) => b.fields().model_key(),
            AlgorithmConfig::EnvOwned { .. } => None,
        }
    }

    /// Whether it imitates a frozen actor's tokens (`sft`); other builtins train the policy on its
    /// own samples, and env-owned ones are the env server's business.
    pub fn imitates_frozen_actor(&self) -> bool {
        match self {
            AlgorithmConfig::Builtin(b) => b.fields().imitates_frozen_actor(),
            AlgorithmConfig::EnvOwned { .. } => false,
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
        if BuiltinAlgorithm::IDS.contains(&id.as_str()) {
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
            AlgorithmConfig::Builtin(BuiltinAlgorithm::Echo(EchoConfig {
                alpha: 0.1,
                roles: vec![EchoRole::Tool, EchoRole::User]
            }))
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
