//! Loading: command-line operations -> merged tree (with origins) -> deprecated keys translated ->
//! typed config (errors carry the full key path and its origin) -> resolved and validated.

use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::cli::{Op, parse_args};
use crate::deprecated::{Deprecation, translate_key, translate_tree};
use crate::error::{ConfigError, Result};
use crate::schema_nav::{Lookup, SchemaNav, coerce};
use crate::suggest::closest;
use crate::tree::{Origins, from_toml, merge, nest, none_strings_to_null, set_path};

const COMMAND_LINE: &str = "the command line";

/// A config type that `rl <command>` loads.
pub trait ConfigFile: DeserializeOwned + Serialize + JsonSchema {
    /// Where the orchestrator section sits, for deprecated-key translation (`None`: nowhere).
    const ORCHESTRATOR_AT: Option<&'static [&'static str]> = None;

    /// Where prime-rl's top-level `[monitors]` and its `model.lora` would sit, if this config has
    /// counterparts: `[wandb]` at the top level, `lora` in the table named.
    const PRIME_RL: crate::prime_rl::PrimeRlLayout =
        crate::prime_rl::PrimeRlLayout { monitors: false, trainer_at: None, sft: false, inference_at: None };

    /// Where the config's model sections sit (tables with `path` and `name`), for
    /// [`load_resolving`]'s model lookup.
    const MODELS_AT: &'static [&'static [&'static str]] = &[];

    /// Rewrites the merged raw tree before typing it (shared-key propagation).
    fn prepare(_raw: &mut Value) -> Result<()> {
        Ok(())
    }

    /// Fills derived values in and checks every rule.
    fn finish(&mut self) -> Result<()>;

    /// The resolved configs a dry run writes: (directory, [(file name, JSON)]).
    fn resolved_files(&self) -> Result<(PathBuf, Vec<(PathBuf, Value)>)>;
}

/// A loaded config and the deprecation warnings met on the way.
#[derive(Debug)]
pub struct Loaded<T> {
    /// The resolved, validated config.
    pub config: T,
    /// One entry per deprecated key that was translated.
    pub warnings: Vec<Deprecation>,
}

/// Finds the local copy of a model `path` that is not a directory (a hub id in the hub cache, say):
/// `Ok(Some(dir))` to use instead, `Ok(None)` to keep the path, `Err` to refuse it. The config
/// crate does no IO; the binary passes its lookup in.
pub type ModelResolver<'a> = &'a dyn Fn(&str) -> std::result::Result<Option<PathBuf>, String>;

/// Loads a config from command-line arguments (`@ file.toml`, `--key value`, ...).
pub fn load<T: ConfigFile>(args: &[String]) -> Result<Loaded<T>> {
    load_resolving(args, &|_| Ok(None))
}

/// [`load`], with every model section's `path` (or, without one, its `name`, as prime-rl names a
/// model) looked up by `models` first (before shared keys propagate, so every part gets the
/// result): a path it resolves is replaced by the directory found, and the section's `name`, when
/// unset, becomes the path as given (a hub id is served under that id, as vLLM serves
/// `Qwen/Qwen3-0.6B`).
pub fn load_resolving<T: ConfigFile>(args: &[String], models: ModelResolver<'_>) -> Result<Loaded<T>> {
    let (raw, origins, warnings) = merged_tree::<T>(args, models)?;
    let mut config = typed::<T>(&raw, &origins)?;
    config.finish()?;
    Ok(Loaded { config, warnings })
}

/// Replaces resolvable model paths at `T::MODELS_AT` (see [`load_resolving`]).
fn resolve_models(root: &mut Value, at: &[&[&str]], models: ModelResolver<'_>) -> Result<()> {
    for place in at {
        let Some(Value::Object(section)) = place.iter().try_fold(&mut *root, |v, k| v.get_mut(*k)) else {
            continue;
        };
        // prime-rl names the model by its hub id alone (`[model] name = "Qwen/Qwen3-0.6B"`): with
        // no path, the name is looked up too.
        let (field, given) = match (section.get("path"), section.get("name")) {
            (Some(Value::String(path)), _) => ("path", path.clone()),
            (None, Some(Value::String(name))) => ("name", name.clone()),
            _ => continue,
        };
        let key = format!("{}.{field}", place.join("."));
        if let Some(dir) = models(&given).map_err(|m| ConfigError::invalid(key, m))? {
            section.insert(String::from("path"), Value::String(dir.to_string_lossy().into_owned()));
            section.entry("name").or_insert(Value::String(given));
        }
    }
    Ok(())
}

/// `--key @ file` merges a file into `key`, which must be a section: after a flag like `--clean`
/// the `@ file` a user meant for the whole config would otherwise be read as the flag's value.
fn file_fits_key(schema: &Value, at: &[String], path: &Path) -> Result<()> {
    let nav = SchemaNav::new(schema);
    let Lookup::Known(s) = nav.lookup(at) else { return Ok(()) };
    let mut types = nav.types(s);
    types.retain(|t| *t != "null");
    if types.iter().any(|t| matches!(*t, "object" | "any" | "array")) {
        return Ok(());
    }
    let key = at.join(".");
    Err(ConfigError::Cli {
        arg: format!("--{key}"),
        message: format!(
            "`--{key} @ {}` merges that file into `{key}`, which is a {}, not a section: to layer the file on the whole config put `@ {}` before `--{key}`, or give `--{key}` its value",
            path.display(),
            types.join(" or "),
            path.display()
        ),
    })
}

/// Builds the merged raw tree from the arguments, with the origin of every key.
fn merged_tree<T: ConfigFile>(
    args: &[String],
    models: ModelResolver<'_>,
) -> Result<(Value, Origins, Vec<Deprecation>)> {
    let ops = parse_args(args)?;
    let mut root = Value::Object(serde_json::Map::new());
    let mut origins = Origins::default();
    let mut warnings: Vec<Deprecation> = Vec::new();
    let mut schema: Option<Value> = None;
    for op in ops {
        match op {
            Op::File { path, at } => {
                if !at.is_empty() {
                    let schema = schema.get_or_insert_with(|| schemars::schema_for!(T).to_value());
                    file_fits_key(schema, &at, &path)?;
                }
                let origin = path.display().to_string();
                let mut tree = nest(&at, read_file(&path)?);
                push_unique(
                    &mut warnings,
                    crate::prime_rl::translate_tree(&mut tree, T::ORCHESTRATOR_AT, T::PRIME_RL, &origin)?,
                );
                let found = translate_tree(&mut tree, T::ORCHESTRATOR_AT, &origin)?;
                push_unique(&mut warnings, found);
                origins.record("", &tree, &origin);
                merge(&mut root, tree);
            }
            Op::Set { key, values, negated, arg } => {
                let (key, found) = translate_key(&key, T::ORCHESTRATOR_AT, COMMAND_LINE);
                push_unique(&mut warnings, found);
                let schema = schema.get_or_insert_with(|| schemars::schema_for!(T).to_value());
                let value = typed_cli_value(schema, &key, &values, negated, &arg)?;
                origins.record(&key.join("."), &value, COMMAND_LINE);
                set_path(&mut root, &key, value, &arg)?;
            }
        }
    }
    let finished = crate::prime_rl::finish(&mut root, T::ORCHESTRATOR_AT, &warnings)?;
    push_unique(&mut warnings, finished);
    resolve_models(&mut root, T::MODELS_AT, models)?;
    T::prepare(&mut root)?;
    Ok((root, origins, warnings))
}

fn push_unique(all: &mut Vec<Deprecation>, found: Vec<Deprecation>) {
    for d in found {
        if !all.iter().any(|w| w.old == d.old && w.new == d.new) {
            all.push(d);
        }
    }
}

fn typed_cli_value(schema: &Value, key: &[String], values: &[String], negated: bool, arg: &str) -> Result<Value> {
    let nav = SchemaNav::new(schema);
    let mut lookup = nav.lookup(key);
    let mut negated = negated;
    // `--no-x` where the schema really has a key named `no_x`: a bare flag, not a negation.
    if negated && matches!(lookup, Lookup::Unknown { .. }) {
        let mut literal = key.to_vec();
        if let Some(last) = literal.last_mut() {
            *last = format!("no_{last}");
        }
        if let found @ Lookup::Known(_) = nav.lookup(&literal) {
            lookup = found;
            negated = false;
        }
    }
    match lookup {
        Lookup::Known(s) => coerce(&nav, Some(s), values, negated, arg),
        Lookup::Free => coerce(&nav, None, values, negated, arg),
        Lookup::Unknown { at, expected } => {
            let unknown = &key[at];
            if let Some(why) = crate::removed::removed(unknown) {
                return Err(ConfigError::Removed { key: key[..=at].join("."), origin: COMMAND_LINE.to_owned(), why });
            }
            Err(ConfigError::UnknownKey {
                key: key[..=at].join("."),
                origin: COMMAND_LINE.to_owned(),
                suggestion: closest(unknown, expected.iter().map(String::as_str)).map(str::to_owned),
                expected,
            })
        }
    }
}

/// Reads one TOML (or `.json`) config file into a tree.
fn read_file(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
    let parse_err = |message: String| ConfigError::Parse { path: path.to_owned(), message };
    if path.extension().is_some_and(|e| e == "json") {
        let v: Value = serde_json::from_str(&text).map_err(|e| parse_err(e.to_string()))?;
        return if v.is_object() { Ok(v) } else { Err(parse_err(String::from("the top level must be an object"))) };
    }
    let table: toml::Table = toml::from_str(&text).map_err(|e| parse_err(e.to_string().trim_end().to_owned()))?;
    let mut v = from_toml(toml::Value::Table(table)).map_err(|key| {
        ConfigError::invalid(
            key,
            format!("must be a finite number (in {}); nan and inf are not accepted", path.display()),
        )
    })?;
    none_strings_to_null(&mut v);
    Ok(v)
}

/// Types the tree; errors name the full key path and where it came from.
fn typed<T: ConfigFile>(raw: &Value, origins: &Origins) -> Result<T> {
    serde_path_to_error::deserialize::<_, T>(raw).map_err(|e| {
        let path = dotted(e.path());
        let message = e.inner().to_string();
        match typed_error(&path, &message, origins) {
            ConfigError::UnknownKey { key, origin, .. } if let Some(other) = of_another_variant::<T>(raw, &key) => {
                let (tag_key, variants) = other;
                ConfigError::OtherVariant { key, origin, tag_key, variants }
            }
            error => error,
        }
    })
}

/// For a key that a tagged section (`type = ...`) refuses but another of its variants has: the
/// tag's full path and, in words, the variants that have the key and the one chosen.
fn of_another_variant<T: ConfigFile>(raw: &Value, key: &str) -> Option<(String, String)> {
    let parts: Vec<String> = key.split('.').map(str::to_owned).collect();
    let (field, section) = parts.split_last()?;
    let schema = schemars::schema_for!(T).to_value();
    let (tag, tags) = SchemaNav::new(&schema).tags_holding(section, field)?;
    // A JSON pointer walks lists by index too (`algorithms.0`).
    let pointer: String = section.iter().map(|k| format!("/{}", k.replace('~', "~0").replace('/', "~1"))).collect();
    let current = raw.pointer(&pointer).and_then(|s| s.get(tag)).and_then(Value::as_str);
    let section = section.join(".");
    let holding = tags.iter().map(|t| format!("\"{t}\"")).collect::<Vec<_>>().join(" or ");
    let chosen = current.map_or_else(|| format!("the default (`{tag}` unset)"), |c| format!("`{tag} = \"{c}\"`"));
    Some((format!("{section}.{tag}"), format!("`{section}.{tag}` = {holding}, and this `{section}` is {chosen}")))
}

fn dotted(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    path.iter()
        .filter_map(|s| match s {
            Segment::Seq { index } => Some(index.to_string()),
            Segment::Map { key } => Some(key.clone()),
            Segment::Enum { variant } => Some(variant.clone()),
            Segment::Unknown => None,
        })
        .collect::<Vec<_>>()
        .join(".")
}

fn typed_error(path: &str, message: &str, origins: &Origins) -> ConfigError {
    if let Some((field, expected)) = parse_unknown_field(message) {
        let key = if path.is_empty() {
            field.clone()
        } else if path.ends_with(&format!(".{field}")) || path == field {
            path.to_owned()
        } else {
            format!("{path}.{field}")
        };
        if let Some(why) = crate::removed::removed(&field) {
            return ConfigError::Removed { origin: origins.of(&key), key, why };
        }
        return ConfigError::UnknownKey {
            origin: origins.of(&key),
            suggestion: closest(&field, expected.iter().map(String::as_str)).map(str::to_owned),
            expected,
            key,
        };
    }
    let key = if path.is_empty() { String::from("(top level)") } else { path.to_owned() };
    ConfigError::WrongType { origin: origins.of(path), key, message: message.to_owned() }
}

/// Parses serde's "unknown field `x`, expected one of `a`, `b`" message.
fn parse_unknown_field(message: &str) -> Option<(String, Vec<String>)> {
    let rest = &message[message.find("unknown field `")? + "unknown field `".len()..];
    let (field, after) = rest.split_once('`')?;
    // serde writes "expected `a`", "expected `a` or `b`" or "expected one of `a`, `b`, `c`".
    let list = after.split_once("expected ").map_or("", |(_, l)| l).trim_start_matches("one of ");
    let expected = list
        .split(", ")
        .flat_map(|s| s.split(" or "))
        .map(|s| s.trim().trim_matches('`').to_owned())
        .filter(|s| !s.is_empty())
        .collect();
    Some((field.to_owned(), expected))
}

/// Serializes a config to a JSON value.
pub fn to_json<T: Serialize>(config: &T) -> Value {
    serde_json::to_value(config).expect("configs always serialize to JSON")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_field_messages_are_parsed() {
        let (f, e) = parse_unknown_field("unknown field `smapling`, expected one of `sampling`, `env`").unwrap();
        assert_eq!(f, "smapling");
        assert_eq!(e, ["sampling", "env"]);
        let (_, e) = parse_unknown_field("unknown field `alfa`, expected `alpha` or `roles`").unwrap();
        assert_eq!(e, ["alpha", "roles"]);
        let (f, e) = parse_unknown_field("unknown field `x`, expected `id`").unwrap();
        assert_eq!((f.as_str(), e), ("x", vec![String::from("id")]));
        let (_, e) = parse_unknown_field("unknown field `x`, there are no fields").unwrap();
        assert!(e.is_empty());
    }
}
