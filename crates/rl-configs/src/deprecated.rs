//! Deprecated keys, translated to their replacements with one warning each.
//!
//! Renames (inside a table) run before moves (of a whole table), so every warning names a key the
//! user actually wrote.

use std::fmt;

use serde_json::{Map, Value};

use crate::error::{ConfigError, Result};

/// One translated key: a deprecated one, or prime-rl's spelling of one of ours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deprecation {
    /// The key as written.
    pub old: String,
    /// The key it was translated to (prime-rl's: what it is read as, keys in backticks).
    pub new: String,
    /// Where it came from.
    pub origin: String,
    /// Why it was translated.
    pub kind: Translation,
}

/// Why a key was translated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Translation {
    /// An old key of this schema: it still works and will not forever.
    Deprecated,
    /// prime-rl's spelling (its sources, monitors, `algo`): read as this schema's, no change needed.
    PrimeRl,
}

impl Deprecation {
    /// How the console labels it: `warning` for a deprecated key, `note` for prime-rl's spelling.
    pub fn label(&self) -> &'static str {
        match self.kind {
            Translation::Deprecated => "warning",
            Translation::PrimeRl => "note",
        }
    }
}

impl fmt::Display for Deprecation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            Translation::Deprecated => write!(
                f,
                "`{}` is deprecated, use `{}` instead (auto-translated for now; from {})",
                self.old, self.new, self.origin
            ),
            Translation::PrimeRl => {
                write!(f, "`{}` (prime-rl's spelling) is read as {} (from {})", self.old, self.new, self.origin)
            }
        }
    }
}

/// Key renames inside tables, relative to the orchestrator section: (old, new, tables it applies in).
/// `*` matches any list index. Old table locations are listed so renames can run before moves.
const RENAMES: &[(&str, &str, &[&str])] = &[
    (
        "max_tokens",
        "max_completion_tokens",
        &[
            "train.sampling",
            "train.env.*.sampling",
            "eval.sampling",
            "eval.env.*.sampling",
            "sampling",
            "env.*.sampling",
        ],
    ),
    ("rollouts_per_example", "group_size", &["", "train.env.*", "eval", "eval.env.*", "env.*"]),
];

/// Whole-table moves, relative to the orchestrator section.
const MOVES: &[(&str, &str)] = &[("sampling", "train.sampling"), ("env", "train.env")];

/// Translates deprecated keys in one source's tree. `orch_at` is where the orchestrator section
/// sits in this config type (`None`: the type has no orchestrator section).
pub(crate) fn translate_tree(root: &mut Value, orch_at: Option<&[&str]>, origin: &str) -> Result<Vec<Deprecation>> {
    let Some(orch_at) = orch_at else { return Ok(Vec::new()) };
    let prefix = orch_at.join(".");
    let Some(orch) = orch_at.iter().try_fold(&mut *root, |node, k| node.get_mut(*k)) else { return Ok(Vec::new()) };
    let mut out = Vec::new();
    for (old, new, tables) in RENAMES {
        for table in *tables {
            let pattern: Vec<&str> = if table.is_empty() { Vec::new() } else { table.split('.').collect() };
            for (path, node) in matching_tables(orch, &pattern, String::new()) {
                let Some(map) = node.as_object_mut() else { continue };
                let Some(value) = map.remove(*old) else { continue };
                let at = join(&prefix, &path);
                let (old_key, new_key) = (join(&at, old), join(&at, new));
                put(map, new, value, &old_key, &new_key, origin)?;
                out.push(Deprecation {
                    old: old_key,
                    new: new_key,
                    origin: origin.to_owned(),
                    kind: Translation::Deprecated,
                });
            }
        }
    }
    for (old, new) in MOVES {
        let Some(map) = orch.as_object_mut() else { break };
        let Some(value) = map.remove(*old) else { continue };
        let (old_key, new_key) = (join(&prefix, old), join(&prefix, new));
        let (parent, leaf) = new.split_once('.').expect("moves go one level down");
        let parent = map.entry(parent.to_owned()).or_insert_with(|| Value::Object(Map::new()));
        if !parent.is_object() {
            *parent = Value::Object(Map::new());
        }
        put(parent.as_object_mut().expect("made an object"), leaf, value, &old_key, &new_key, origin)?;
        out.push(Deprecation { old: old_key, new: new_key, origin: origin.to_owned(), kind: Translation::Deprecated });
    }
    Ok(out)
}

/// Translates a command-line key path. Returns the new path and the deprecations it used.
pub(crate) fn translate_key(key: &[String], orch_at: Option<&[&str]>, origin: &str) -> (Vec<String>, Vec<Deprecation>) {
    let Some(orch_at) = orch_at else { return (key.to_vec(), Vec::new()) };
    if key.len() < orch_at.len() || key.iter().zip(orch_at).any(|(a, b)| a != b) {
        return (key.to_vec(), Vec::new());
    }
    let mut rel: Vec<String> = key[orch_at.len()..].to_vec();
    let prefix = orch_at.join(".");
    let mut out = Vec::new();
    if let Some((last, parent)) = rel.split_last() {
        for (old, new, tables) in RENAMES {
            let matches_table = tables.iter().any(|t| {
                let pattern: Vec<&str> = if t.is_empty() { Vec::new() } else { t.split('.').collect() };
                pattern.len() == parent.len() && pattern.iter().zip(parent).all(|(p, s)| *p == "*" || p == s)
            });
            if last == old && matches_table {
                let old_key = join(&prefix, &rel.join("."));
                let mut renamed = parent.to_vec();
                renamed.push((*new).to_owned());
                out.push(Deprecation {
                    old: old_key,
                    new: join(&prefix, &renamed.join(".")),
                    origin: origin.to_owned(),
                    kind: Translation::Deprecated,
                });
                rel = renamed;
                break;
            }
        }
    }
    for (old, new) in MOVES {
        if rel.first().is_some_and(|first| first == old) {
            let mut moved: Vec<String> = new.split('.').map(String::from).collect();
            moved.extend(rel[1..].iter().cloned());
            out.push(Deprecation {
                old: join(&prefix, &rel.join(".")),
                new: join(&prefix, &moved.join(".")),
                origin: origin.to_owned(),
                kind: Translation::Deprecated,
            });
            rel = moved;
        }
    }
    let mut full: Vec<String> = orch_at.iter().map(|s| (*s).to_owned()).collect();
    full.extend(rel);
    (full, out)
}

fn put(map: &mut Map<String, Value>, key: &str, value: Value, old: &str, new: &str, origin: &str) -> Result<()> {
    match map.get(key) {
        Some(existing) if *existing != value => {
            Err(ConfigError::DeprecatedConflict { old: old.to_owned(), new: new.to_owned(), origin: origin.to_owned() })
        }
        _ => {
            map.insert(key.to_owned(), value);
            Ok(())
        }
    }
}

pub(crate) fn join(prefix: &str, rest: &str) -> String {
    match (prefix.is_empty(), rest.is_empty()) {
        (true, _) => rest.to_owned(),
        (_, true) => prefix.to_owned(),
        _ => format!("{prefix}.{rest}"),
    }
}

/// Every table in `node` that matches `pattern` (with `*` over list indices), with its relative path.
fn matching_tables<'a>(node: &'a mut Value, pattern: &[&str], path: String) -> Vec<(String, &'a mut Value)> {
    let Some((first, rest)) = pattern.split_first() else { return vec![(path, node)] };
    let child_path = |k: &str| if path.is_empty() { k.to_owned() } else { format!("{path}.{k}") };
    match (node, *first) {
        (Value::Array(items), "*") => items
            .iter_mut()
            .enumerate()
            .flat_map(|(i, item)| matching_tables(item, rest, child_path(&i.to_string())))
            .collect(),
        (Value::Object(map), key) if key != "*" => match map.get_mut(key) {
            Some(child) => matching_tables(child, rest, child_path(key)),
            None => Vec::new(),
        },
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const RL: Option<&[&str]> = Some(&["orchestrator"]);

    #[test]
    fn translates_every_deprecated_key_once() {
        let mut tree = json!({"orchestrator": {
            "rollouts_per_example": 8,
            "sampling": {"temperature": 0.7, "max_tokens": 64},
            "env": [{"id": "reverse-text", "rollouts_per_example": 4, "sampling": {"max_tokens": 32}}],
        }});
        let deps = translate_tree(&mut tree, RL, "c.toml").unwrap();
        assert_eq!(
            tree,
            json!({"orchestrator": {
                "group_size": 8,
                "train": {
                    "sampling": {"temperature": 0.7, "max_completion_tokens": 64},
                    "env": [{"id": "reverse-text", "group_size": 4, "sampling": {"max_completion_tokens": 32}}],
                },
            }})
        );
        let olds: Vec<&str> = deps.iter().map(|d| d.old.as_str()).collect();
        assert_eq!(
            olds,
            [
                "orchestrator.sampling.max_tokens",
                "orchestrator.env.0.sampling.max_tokens",
                "orchestrator.rollouts_per_example",
                "orchestrator.env.0.rollouts_per_example",
                "orchestrator.sampling",
                "orchestrator.env",
            ]
        );
    }

    #[test]
    fn old_and_new_with_different_values_conflict() {
        let mut tree =
            json!({"orchestrator": {"train": {"sampling": {"max_tokens": 10, "max_completion_tokens": 20}}}});
        let err = translate_tree(&mut tree, RL, "c.toml").unwrap_err();
        assert!(matches!(err, ConfigError::DeprecatedConflict { .. }), "{err}");
        let mut same =
            json!({"orchestrator": {"train": {"sampling": {"max_tokens": 10, "max_completion_tokens": 10}}}});
        assert_eq!(translate_tree(&mut same, RL, "c.toml").unwrap().len(), 1);
    }

    #[test]
    fn command_line_keys_are_translated_too() {
        let key: Vec<String> = "orchestrator.sampling.max_tokens".split('.').map(String::from).collect();
        let (new, deps) = translate_key(&key, RL, "the command line");
        assert_eq!(new.join("."), "orchestrator.train.sampling.max_completion_tokens");
        assert_eq!(deps.len(), 2);
        let key: Vec<String> = "rollouts_per_example".split('.').map(String::from).collect();
        let (new, _) = translate_key(&key, Some(&[]), "the command line");
        assert_eq!(new.join("."), "group_size");
    }
}
