//! The orchestrator config's rules for its algorithm lists (ids, ranges, the models an algorithm
//! names, what `sft` and `opd` need of the actor), kept apart from `orchestrator.rs`.

use std::collections::BTreeSet;

use crate::algorithms::AlgorithmConfig;
use crate::error::{ConfigError, Result};
use crate::orchestrator::{OrchestratorConfig, POLICY_KEY};

impl OrchestratorConfig {
    pub(crate) fn validate_algorithms(&self, key: &str, algos: &[AlgorithmConfig]) -> Result<()> {
        if algos.is_empty() {
            return Err(ConfigError::invalid(key, "select at least one algorithm (e.g. [\"grpo\"])"));
        }
        let mut seen = BTreeSet::new();
        for (i, a) in algos.iter().enumerate() {
            let ak = format!("{key}.{i}");
            a.validate(&ak)?;
            if !seen.insert(a.id()) {
                return Err(ConfigError::invalid(ak, format!("algorithm `{}` is selected twice", a.id())));
            }
            if let Some(model) = a.model_key() {
                if model != POLICY_KEY && !self.models.contains_key(model) {
                    return Err(ConfigError::invalid(
                        format!("{ak}.model"),
                        format!(
                            "`{}` scores with model `{model}`, which is not configured ({})",
                            a.id(),
                            self.model_keys()
                        ),
                    ));
                }
                if let Some(m) = self.models.get(model)
                    && !m.tokens
                {
                    return Err(ConfigError::invalid(
                        format!("{ak}.model"),
                        format!(
                            "`{}` needs token-level scoring, but model `{model}` does not set `tokens = true`",
                            a.id()
                        ),
                    ));
                }
            }
            let is_sft = a.imitates_frozen_actor();
            if !is_sft && matches!(a, AlgorithmConfig::Builtin(_)) && self.actor != POLICY_KEY {
                return Err(ConfigError::invalid(
                    ak,
                    format!(
                        "`{}` trains the policy on its own samples, but `orchestrator.actor` is `{}`: \
                         use `sft` to imitate a frozen actor, or set actor = \"policy\"",
                        a.id(),
                        self.actor
                    ),
                ));
            }
            if is_sft && self.actor == POLICY_KEY {
                return Err(ConfigError::invalid(
                    ak,
                    "`sft` trains on a frozen actor's tokens: set `orchestrator.actor` to a key of `orchestrator.models`",
                ));
            }
            if is_sft && self.models.get(&self.actor).is_some_and(|m| !m.tokens) {
                return Err(ConfigError::invalid(
                    format!("models.{}.tokens", self.actor),
                    format!(
                        "`sft` trains on the token ids the actor returns, but model `{}` does not set `tokens = true`",
                        self.actor
                    ),
                ));
            }
        }
        Ok(())
    }
}
