//! What the config side asks of a builtin algorithm's fields: their checks and the few facts
//! cross-section validation needs.

use crate::error::Result;

/// What the config side knows about one builtin algorithm's fields. The defaults fit an algorithm
/// without fields.
pub(crate) trait AlgorithmFields {
    /// Checks the fields' ranges; `key` is the dotted path of the entry.
    fn validate(&self, _key: &str) -> Result<()> {
        Ok(())
    }

    /// Checks the fields against the group size of env `env` it runs on.
    fn validate_group(&self, _key: &str, _group: u32, _env: &str) -> Result<()> {
        Ok(())
    }

    /// The key of the model this algorithm scores with, if any.
    fn model_key(&self) -> Option<&str> {
        None
    }

    /// Whether it imitates a frozen actor's tokens (every other builtin trains the policy on its
    /// own samples).
    fn imitates_frozen_actor(&self) -> bool {
        false
    }
}
