//! `[env_vars]` of `rl rl`: environment variables set for every process the launcher starts
//! (prime-rl's key), checked as names a process environment can hold.

use std::collections::BTreeMap;

use crate::error::{ConfigError, Result};

/// Variables the launcher sets itself for its children; a config may not override them.
const RESERVED: &[&str] = &["RL_LAUNCHER_PID"];

/// Checks each name (letters, digits and `_`, not starting with a digit, not reserved) and value
/// (no NUL byte); `key` is the dotted path of the table.
pub(crate) fn validate(key: &str, vars: &BTreeMap<String, String>) -> Result<()> {
    for (name, value) in vars {
        let at = format!("{key}.{name}");
        let mut chars = name.chars();
        let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(ConfigError::invalid(at, "is not an environment variable name (letters, digits and `_`)"));
        }
        if RESERVED.contains(&name.as_str()) {
            return Err(ConfigError::invalid(at, "is set by the launcher itself for its children"));
        }
        if value.contains('\0') {
            return Err(ConfigError::invalid(at, "must not contain a NUL byte"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_must_be_usable_and_not_reserved() {
        let vars = |n: &str, v: &str| BTreeMap::from([(n.to_owned(), v.to_owned())]);
        assert!(validate("env_vars", &vars("HF_HUB_OFFLINE", "0")).is_ok());
        assert!(validate("env_vars", &vars("_X1", "")).is_ok());
        for bad in ["", "1X", "A-B", "A B", "RL_LAUNCHER_PID"] {
            assert!(validate("env_vars", &vars(bad, "1")).is_err(), "{bad:?}");
        }
        assert!(validate("env_vars", &vars("A", "x\0y")).is_err());
    }
}
