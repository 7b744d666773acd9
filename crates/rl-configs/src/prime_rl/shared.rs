//! What every part of the prime-rl translation shares: its notes, and the shapes that appear in
//! several sections (an `algo` table, a sampling table's `extra_body`).

use serde_json::{Value, json};

use crate::deprecated::{Deprecation, Translation};
use crate::error::{ConfigError, Result};

/// The notes of one source of keys.
pub(super) struct Notes<'a> {
    pub(super) origin: &'a str,
    pub(super) out: Vec<Deprecation>,
}

impl Notes<'_> {
    /// `old` is read as the key `new`.
    pub(super) fn push(&mut self, old: String, new: &str) {
        self.said(old, format!("`{new}`"));
    }

    /// `old` is read as `text` says.
    pub(super) fn said(&mut self, old: String, text: String) {
        self.out.push(Deprecation { old, new: text, origin: self.origin.to_owned(), kind: Translation::PrimeRl });
    }
}

/// prime-rl's `extra_body` of a sampling table is our `extra`.
pub(super) fn extra_body(sampling: &mut Value, key: &str, notes: &mut Notes<'_>) {
    let Some(map) = sampling.as_object_mut() else { return };
    if let Some(body) = map.remove("extra_body") {
        map.insert(String::from("extra"), body);
        notes.push(format!("{key}.extra_body"), &format!("{key}.extra"));
    }
}

/// prime-rl's `{ type = "rae", decay = 0.9 }` is our `{ id = "rae", decay = 0.9 }` (the same
/// algorithm names; grpo when `type` is unset).
pub(super) fn algorithm(algo: Value, key: &str) -> Result<Value> {
    let Value::Object(mut algo) = algo else {
        return Err(ConfigError::invalid(key, "must be a table such as { type = \"grpo\" }"));
    };
    let id = algo.remove("type").unwrap_or_else(|| json!("grpo"));
    algo.insert(String::from("id"), id);
    Ok(Value::Object(algo))
}
