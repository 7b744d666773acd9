//! The untyped config tree (JSON values) that sources are merged into, and where each key came from.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::error::{ConfigError, Result};

/// Deep-merges `overlay` into `base`: tables merge key by key, everything else (lists included) is replaced.
pub(crate) fn merge(base: &mut Value, overlay: Value) {
    match (base, overlay) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(existing) if existing.is_object() && v.is_object() => merge(existing, v),
                    _ => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, o) => *b = o,
    }
}

/// Wraps `value` so that it sits at `path` in an otherwise empty tree.
pub(crate) fn nest(path: &[String], value: Value) -> Value {
    path.iter().rev().fold(value, |inner, key| {
        let mut m = Map::new();
        m.insert(key.clone(), inner);
        Value::Object(m)
    })
}

/// Sets `value` at `path`, creating tables (or, before a numeric segment, lists) on the way.
/// A numeric segment indexes a list; the index may be one past the end to append an entry.
pub(crate) fn set_path(root: &mut Value, path: &[String], value: Value, arg: &str) -> Result<()> {
    let mut node = root;
    for (i, seg) in path.iter().enumerate() {
        let last = i + 1 == path.len();
        let next_is_index = path.get(i + 1).is_some_and(|s| s.parse::<usize>().is_ok());
        let fresh = || if next_is_index { Value::Array(Vec::new()) } else { Value::Object(Map::new()) };
        if let Value::Array(items) = node {
            let index: usize = seg.parse().map_err(|_| ConfigError::Cli {
                arg: arg.to_owned(),
                message: format!("`{}` is a list: index it with a number, got `{seg}`", path[..i].join(".")),
            })?;
            if index > items.len() {
                return Err(ConfigError::Cli {
                    arg: arg.to_owned(),
                    message: format!(
                        "index {index} is out of range: `{}` has {} entries (use {} to append one)",
                        path[..i].join("."),
                        items.len(),
                        items.len()
                    ),
                });
            }
            if index == items.len() {
                items.push(Value::Object(Map::new()));
            }
            if last {
                items[index] = value;
                return Ok(());
            }
            node = &mut items[index];
            if !(node.is_object() || node.is_array()) {
                *node = fresh();
            }
            continue;
        }
        if !node.is_object() {
            *node = Value::Object(Map::new());
        }
        let map = node.as_object_mut().expect("made an object above");
        if last {
            map.insert(seg.clone(), value);
            return Ok(());
        }
        let child = map.entry(seg.clone()).or_insert_with(fresh);
        if !(child.is_object() || child.is_array()) {
            *child = fresh();
        }
        node = child;
    }
    *node = value;
    Ok(())
}

/// Turns the string `"None"` into null everywhere (the TOML way of unsetting an optional value).
pub(crate) fn none_strings_to_null(v: &mut Value) {
    match v {
        Value::String(s) if s == "None" => *v = Value::Null,
        Value::Array(items) => items.iter_mut().for_each(none_strings_to_null),
        Value::Object(map) => map.values_mut().for_each(none_strings_to_null),
        _ => {}
    }
}

/// Converts parsed TOML into the JSON tree (datetimes become strings). JSON has no NaN or
/// infinity, so a non-finite float is an error carrying its dotted key (`a.b.0.c`) rather than a
/// `null` that would later be blamed on the wrong key.
pub(crate) fn from_toml(v: toml::Value) -> std::result::Result<Value, String> {
    fn go(v: toml::Value, path: &mut Vec<String>) -> std::result::Result<Value, String> {
        Ok(match v {
            toml::Value::String(s) => Value::String(s),
            toml::Value::Integer(i) => Value::from(i),
            toml::Value::Float(f) => {
                serde_json::Number::from_f64(f).map(Value::Number).ok_or_else(|| path.join("."))?
            }
            toml::Value::Boolean(b) => Value::Bool(b),
            toml::Value::Datetime(d) => Value::String(d.to_string()),
            toml::Value::Array(items) => {
                let mut out = Vec::with_capacity(items.len());
                for (i, item) in items.into_iter().enumerate() {
                    path.push(i.to_string());
                    out.push(go(item, path)?);
                    path.pop();
                }
                Value::Array(out)
            }
            toml::Value::Table(t) => {
                let mut out = serde_json::Map::new();
                for (k, v) in t {
                    path.push(k.clone());
                    out.insert(k, go(v, path)?);
                    path.pop();
                }
                Value::Object(out)
            }
        })
    }
    go(v, &mut Vec::new())
}

/// Where each key of the merged tree came from (a file, or the command line).
#[derive(Debug, Default)]
pub(crate) struct Origins {
    by_key: BTreeMap<String, String>,
}

impl Origins {
    /// Records `origin` for every leaf of `value`, which sits at `prefix`.
    pub(crate) fn record(&mut self, prefix: &str, value: &Value, origin: &str) {
        match value {
            Value::Object(map) if !map.is_empty() => {
                for (k, v) in map {
                    let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                    self.record(&key, v, origin);
                }
            }
            _ => {
                let stale = format!("{prefix}.");
                self.by_key.retain(|k, _| !k.starts_with(&stale));
                self.by_key.insert(prefix.to_owned(), origin.to_owned());
            }
        }
    }

    /// Where `key` came from: the key itself, a key below it, or the closest key above it.
    pub(crate) fn of(&self, key: &str) -> String {
        if let Some(o) = self.by_key.get(key) {
            return o.clone();
        }
        let below = format!("{key}.");
        if let Some((_, o)) = self.by_key.range(below.clone()..).next().filter(|(k, _)| k.starts_with(&below)) {
            return o.clone();
        }
        let mut parts: Vec<&str> = key.split('.').collect();
        while parts.pop().is_some() && !parts.is_empty() {
            if let Some(o) = self.by_key.get(&parts.join(".")) {
                return o.clone();
            }
        }
        String::from("the defaults")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_is_deep_for_tables_and_replaces_lists() {
        let mut base = json!({"a": {"x": 1, "y": 2}, "l": [1, 2, 3]});
        merge(&mut base, json!({"a": {"y": 3, "z": 4}, "l": [9]}));
        assert_eq!(base, json!({"a": {"x": 1, "y": 3, "z": 4}, "l": [9]}));
    }

    #[test]
    fn set_path_indexes_and_appends_lists() {
        let mut root = json!({"env": [{"id": "a"}]});
        let p = |s: &str| s.split('.').map(String::from).collect::<Vec<_>>();
        set_path(&mut root, &p("env.0.group_size"), json!(8), "arg").unwrap();
        set_path(&mut root, &p("env.1.id"), json!("b"), "arg").unwrap();
        assert_eq!(root, json!({"env": [{"id": "a", "group_size": 8}, {"id": "b"}]}));
        let err = set_path(&mut root, &p("env.5.id"), json!("c"), "arg").unwrap_err();
        assert!(err.to_string().contains("out of range"), "{err}");
    }

    #[test]
    fn origins_find_the_closest_recorded_key() {
        let mut o = Origins::default();
        o.record("", &json!({"orchestrator": {"train": {"env": [{"id": "x"}]}}, "a": {"b": 1}}), "f.toml");
        o.record("a.b", &json!(2), "the command line");
        assert_eq!(o.of("orchestrator.train.env.0.idd"), "f.toml");
        assert_eq!(o.of("a.b"), "the command line");
        assert_eq!(o.of("orchestrator"), "f.toml");
        assert_eq!(o.of("zzz"), "the defaults");
    }
}
