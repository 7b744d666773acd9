//! `LoraConfig`: low-rank adapters on the decoder's projections (`[trainer.lora]`, `[lora]` in
//! `rl sft`), with PEFT's names and defaults so an adapter trained here loads there.

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize};

use crate::error::{ConfigError, Result};

/// The projections an adapter can sit on, as PEFT's `target_modules` name them.
pub const LORA_MODULES: [&str; 7] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];

/// LoRA: the base weights are frozen; each targeted projection `W` learns `W + (alpha / rank) B A`
/// with `A [rank, in]` initialised as PEFT does (Kaiming-uniform) and `B [out, rank]` at zero.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct LoraConfig {
    /// The adapters' rank `r`.
    pub rank: u32,
    /// Scaling numerator: the update is `alpha / rank * B A`.
    pub alpha: f64,
    /// Dropout on the adapters' inputs during training (PEFT's `lora_dropout`), in `[0, 1)`: each
    /// adapted projection zeroes each input element with this probability and scales the rest
    /// by `1 / (1 - dropout)`. Evaluation, generation and the inference engine compute without
    /// it, so in RL a non-zero value makes the trainer's log-probabilities differ from the
    /// sampler's (it shows in the mismatch KL).
    pub dropout: f64,
    /// Projections that carry an adapter (any of q_proj, k_proj, v_proj, o_proj, gate_proj,
    /// up_proj, down_proj), or PEFT's `"all-linear"`: every one of them.
    #[serde(deserialize_with = "modules")]
    #[schemars(schema_with = "modules_schema")]
    pub target_modules: Vec<String>,
}

/// PEFT's name for every linear projection of the decoder (the output head excluded, as PEFT does).
const ALL_LINEAR: &str = "all-linear";

/// `target_modules`: a list of projection names, or `"all-linear"`.
fn modules<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Vec<String>, D::Error> {
    use serde::de::Error as _;
    match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(s) if s == ALL_LINEAR => Ok(LORA_MODULES.iter().map(|m| (*m).to_owned()).collect()),
        v @ serde_json::Value::Array(_) => serde_json::from_value(v).map_err(D::Error::custom),
        other => Err(D::Error::custom(format!("expected a list of projection names or \"{ALL_LINEAR}\", got {other}"))),
    }
}

fn modules_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "A list of projection names, or \"all-linear\"",
        "anyOf": [{"type": "array", "items": {"type": "string"}}, {"const": ALL_LINEAR}]
    })
}

impl Default for LoraConfig {
    fn default() -> Self {
        LoraConfig {
            rank: 16,
            alpha: 32.0,
            dropout: 0.0,
            target_modules: LORA_MODULES.iter().map(|m| (*m).to_owned()).collect(),
        }
    }
}

impl LoraConfig {
    /// Checks ranges and names; `key` is the dotted path of this section.
    pub fn validate(&self, key: &str) -> Result<()> {
        if self.rank == 0 {
            return Err(ConfigError::invalid(format!("{key}.rank"), "must be at least 1, got 0"));
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return Err(ConfigError::invalid(format!("{key}.alpha"), format!("must be positive, got {}", self.alpha)));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(ConfigError::invalid(
                format!("{key}.dropout"),
                format!("must be in [0, 1) (a probability of zeroing an input), got {}", self.dropout),
            ));
        }
        if self.target_modules.is_empty() {
            return Err(ConfigError::invalid(format!("{key}.target_modules"), "names no projection"));
        }
        for (i, m) in self.target_modules.iter().enumerate() {
            if !LORA_MODULES.contains(&m.as_str()) {
                return Err(ConfigError::invalid(
                    format!("{key}.target_modules"),
                    format!("unknown module {m:?}: expected any of {}", LORA_MODULES.join(", ")),
                ));
            }
            if self.target_modules[..i].contains(m) {
                return Err(ConfigError::invalid(format!("{key}.target_modules"), format!("names {m:?} twice")));
            }
        }
        Ok(())
    }

    /// `alpha / rank`.
    pub fn scale(&self) -> f64 {
        self.alpha / f64::from(self.rank.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_peft_shaped_and_bad_values_are_named() {
        let c = LoraConfig::default();
        assert!(c.validate("trainer.lora").is_ok());
        assert_eq!(c.scale(), 2.0);
        let bad = |c: LoraConfig| c.validate("trainer.lora").unwrap_err().to_string();
        assert!(bad(LoraConfig { rank: 0, ..c.clone() }).contains("trainer.lora.rank"));
        assert!(bad(LoraConfig { alpha: f64::NAN, ..c.clone() }).contains("trainer.lora.alpha"));
        assert!(LoraConfig { dropout: 0.05, ..c.clone() }.validate("trainer.lora").is_ok());
        assert!(bad(LoraConfig { dropout: 1.0, ..c.clone() }).contains("trainer.lora.dropout"));
        assert!(bad(LoraConfig { dropout: -0.1, ..c.clone() }).contains("trainer.lora.dropout"));
        assert!(bad(LoraConfig { dropout: f64::NAN, ..c.clone() }).contains("trainer.lora.dropout"));
        let e = bad(LoraConfig { target_modules: vec!["qproj".into()], ..c });
        assert!(e.contains("trainer.lora.target_modules") && e.contains("q_proj"), "{e}");
        assert!(bad(LoraConfig { target_modules: vec!["q_proj".into(), "q_proj".into()], ..c }).contains("twice"));
        let all: LoraConfig = serde_json::from_value(serde_json::json!({"target_modules": "all-linear"})).unwrap();
        assert_eq!(all.target_modules, LoraConfig::default().target_modules, "PEFT's all-linear is every projection");
        let err = serde_json::from_value::<LoraConfig>(serde_json::json!({"target_modules": "q_proj"})).unwrap_err();
        assert!(err.to_string().contains("all-linear"), "{err}");
    }
}
