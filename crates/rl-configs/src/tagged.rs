//! Internally tagged enums (`type = "..."`) whose tag may be omitted to keep the default variant.

use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer};

/// Deserializes a `type`-tagged table, inserting `type = default_tag` when the table has none.
pub(crate) fn with_default_tag<'de, D, T>(deserializer: D, default_tag: &str) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    let mut value = serde_json::Value::deserialize(deserializer)?;
    if let serde_json::Value::Object(map) = &mut value {
        map.entry("type").or_insert_with(|| serde_json::Value::String(default_tag.to_owned()));
    }
    T::deserialize(value).map_err(|e| D::Error::custom(e.to_string()))
}
