//! Internally tagged enums (`type = "..."`) whose tag may be omitted to keep the default variant.

use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

/// Deserializes a `type`-tagged table, inserting `type = default_tag` when the table has none.
pub(crate) fn with_default_tag<'de, D, T>(deserializer: D, default_tag: &str) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    with_default_tag_by(deserializer, |_| default_tag)
}

/// [`with_default_tag`] with the tag chosen from the table's other keys.
pub(crate) fn with_default_tag_by<'de, 'a, D, T>(
    deserializer: D,
    default_tag: impl FnOnce(&Map<String, Value>) -> &'a str,
) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    let mut value = Value::deserialize(deserializer)?;
    if let Value::Object(map) = &mut value
        && !map.contains_key("type")
    {
        let tag = default_tag(map).to_owned();
        map.insert(String::from("type"), Value::String(tag));
    }
    T::deserialize(value).map_err(|e| D::Error::custom(e.to_string()))
}
