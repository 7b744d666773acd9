//! Walks the JSON Schema (schemars) of a config type to type command-line values and to find
//! the keys allowed at a place.

use serde_json::Value;

use crate::algorithms::describe;
use crate::error::{ConfigError, Result};

/// What the schema says about a key.
#[derive(Debug)]
pub(crate) enum Lookup<'a> {
    /// A known key with this schema.
    Known(&'a Value),
    /// A key inside a free-form table: any value goes.
    Free,
    /// The schema has no such key; these are the keys allowed there.
    Unknown { at: usize, expected: Vec<String> },
}

/// A config type's JSON Schema, with `$ref`s resolved against its `$defs`.
#[derive(Debug)]
pub(crate) struct SchemaNav<'a> {
    root: &'a Value,
}

impl<'a> SchemaNav<'a> {
    pub(crate) fn new(root: &'a Value) -> Self {
        SchemaNav { root }
    }

    fn resolve(&self, mut s: &'a Value) -> &'a Value {
        for _ in 0..32 {
            let Some(r) = s.get("$ref").and_then(Value::as_str) else { break };
            let Some(name) = r.strip_prefix("#/$defs/") else { break };
            match self.root.get("$defs").and_then(|d| d.get(name)) {
                Some(target) => s = target,
                None => break,
            }
        }
        s
    }

    /// The alternatives of a schema (through `anyOf`/`oneOf`/`allOf`), resolved.
    fn variants(&self, s: &'a Value) -> Vec<&'a Value> {
        let s = self.resolve(s);
        let mut out = Vec::new();
        let mut nested = false;
        for key in ["anyOf", "oneOf", "allOf"] {
            if let Some(list) = s.get(key).and_then(Value::as_array) {
                nested = true;
                for v in list {
                    out.extend(self.variants(v));
                }
            }
        }
        if !nested || s.get("properties").is_some() {
            out.push(s);
        }
        out
    }

    /// The schema of the key at `path`.
    pub(crate) fn lookup(&self, path: &[String]) -> Lookup<'a> {
        let mut current = self.root;
        for (depth, seg) in path.iter().enumerate() {
            let mut expected = Vec::new();
            let mut found = None;
            let mut free = false;
            for v in self.variants(current) {
                if let Some(p) = v.get("properties").and_then(|p| p.get(seg)) {
                    found = Some(p);
                    break;
                }
                if let Some(props) = v.get("properties").and_then(Value::as_object) {
                    expected.extend(props.keys().cloned());
                }
                if seg.parse::<usize>().is_ok() && has_type(v, "array") {
                    match v.get("items") {
                        Some(items) => found = Some(items),
                        None => free = true,
                    }
                    break;
                }
                match v.get("additionalProperties") {
                    Some(Value::Bool(false)) => {}
                    Some(Value::Bool(true)) => free = true,
                    Some(schema @ Value::Object(_)) => {
                        found = Some(schema);
                        break;
                    }
                    _ if v.get("properties").is_none()
                        && (has_type(v, "object")
                            || v.as_object().is_some_and(|o| o.is_empty())
                            || v == &Value::Bool(true)) =>
                    {
                        free = true
                    }
                    _ => {}
                }
            }
            match found {
                Some(next) => current = next,
                None if free => return Lookup::Free,
                None => {
                    expected.sort();
                    expected.dedup();
                    return Lookup::Unknown { at: depth, expected };
                }
            }
        }
        Lookup::Known(current)
    }

    /// The JSON types a schema accepts (`any` when it does not say).
    pub(crate) fn types(&self, s: &'a Value) -> Vec<&'static str> {
        let mut out = Vec::new();
        for v in self.variants(s) {
            match v.get("type") {
                Some(Value::String(t)) => out.push(static_type(t)),
                Some(Value::Array(ts)) => out.extend(ts.iter().filter_map(Value::as_str).map(static_type)),
                _ if v.get("enum").is_some() || v.get("const").is_some_and(Value::is_string) => out.push("string"),
                _ if v.get("properties").is_some() => out.push("object"),
                _ => out.push("any"),
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The tag key (`type`, or `id` for algorithms) and the tags of the variants of the tagged
    /// section at `section` that have the key `field` (`type`, `["jsonl"]` for `data` and
    /// `path`); `None` where the section is not tagged or no variant has the key.
    pub(crate) fn tags_holding(&self, section: &[String], field: &str) -> Option<(&'static str, Vec<String>)> {
        let Lookup::Known(s) = self.lookup(section) else { return None };
        let holding: Vec<&Value> =
            self.variants(s).into_iter().filter(|v| v.get("properties").and_then(|p| p.get(field)).is_some()).collect();
        ["type", "id"].into_iter().find_map(|tag| {
            let tags: Vec<String> = holding
                .iter()
                .filter_map(|v| v.pointer(&format!("/properties/{tag}/const")).and_then(Value::as_str))
                .map(str::to_owned)
                .collect();
            (!tags.is_empty()).then_some((tag, tags))
        })
    }

    /// The schema of a list's items.
    pub(crate) fn items(&self, s: &'a Value) -> Option<&'a Value> {
        self.variants(s).into_iter().find_map(|v| v.get("items"))
    }
}

fn has_type(v: &Value, t: &str) -> bool {
    match v.get("type") {
        Some(Value::String(s)) => s == t,
        Some(Value::Array(ts)) => ts.iter().any(|x| x == t),
        _ => false,
    }
}

fn static_type(t: &str) -> &'static str {
    match t {
        "string" => "string",
        "integer" => "integer",
        "number" => "number",
        "boolean" => "boolean",
        "array" => "array",
        "object" => "object",
        "null" => "null",
        _ => "any",
    }
}

/// Turns command-line words into a value of the type the schema expects.
pub(crate) fn coerce(
    nav: &SchemaNav<'_>,
    schema: Option<&Value>,
    values: &[String],
    negated: bool,
    arg: &str,
) -> Result<Value> {
    let types = schema.map_or_else(|| vec!["any"], |s| nav.types(s));
    let has = |t: &str| types.contains(&t) || types.contains(&"any");
    let expected = types.join(" or ");
    let wrong = |message: String| ConfigError::Cli { arg: arg.to_owned(), message };
    if negated {
        return if types.contains(&"boolean") {
            Ok(Value::Bool(false))
        } else if types.contains(&"null") {
            Ok(Value::Null)
        } else {
            Err(wrong(format!("`--no-` works only for booleans and optional settings; this key expects {expected}")))
        };
    }
    if values.is_empty() {
        return if types.contains(&"boolean") || types == ["any"] {
            Ok(Value::Bool(true))
        } else if types.contains(&"object") {
            Ok(Value::Object(serde_json::Map::new()))
        } else {
            Err(wrong(format!("expects a value ({expected})")))
        };
    }
    let single_string = types.contains(&"string") && values.len() == 1 && !values[0].starts_with('[');
    if types.contains(&"array") && !single_string {
        if values.len() == 1 && values[0].starts_with('[') {
            let parsed: Value = serde_json::from_str(&values[0])
                .map_err(|e| wrong(format!("expected a JSON list, got {:?}: {e}", values[0])))?;
            return Ok(parsed);
        }
        let items = schema.and_then(|s| nav.items(s));
        let list: Result<Vec<Value>> = values.iter().map(|v| scalar(nav, items, v, arg)).collect();
        return list.map(Value::Array);
    }
    if values.len() > 1 {
        return Err(wrong(format!("expects one value ({expected}), got {}: {}", values.len(), values.join(" "))));
    }
    let v = &values[0];
    if (has("object") || has("array")) && (v.starts_with('{') || v.starts_with('[')) {
        return serde_json::from_str(v).map_err(|e| wrong(format!("expected JSON, got {v:?}: {e}")));
    }
    scalar(nav, schema, v, arg)
}

fn scalar(nav: &SchemaNav<'_>, schema: Option<&Value>, v: &str, arg: &str) -> Result<Value> {
    let types = schema.map_or_else(|| vec!["any"], |s| nav.types(s));
    let any = types.contains(&"any");
    let has = |t: &str| types.contains(&t);
    if (v == "None" || v == "null") && (has("null") || any) {
        return Ok(Value::Null);
    }
    if has("integer") || any {
        if let Ok(i) = v.parse::<i64>() {
            return Ok(Value::from(i));
        }
        if let Ok(u) = v.parse::<u64>() {
            return Ok(Value::from(u));
        }
    }
    if (has("number") || any)
        && let Ok(f) = v.parse::<f64>()
    {
        if let Some(n) = serde_json::Number::from_f64(f) {
            return Ok(Value::Number(n));
        }
        // "nan" or "inf" where only a number fits (free-form keys keep it as a string).
        if !any && !has("string") {
            return Err(ConfigError::Cli {
                arg: arg.to_owned(),
                message: format!("must be a finite number, got {v:?}; nan and inf are not accepted"),
            });
        }
    }
    if (has("boolean") || any) && (v == "true" || v == "false") {
        return Ok(Value::Bool(v == "true"));
    }
    if any
        && (v.starts_with('{') || v.starts_with('['))
        && let Ok(parsed) = serde_json::from_str::<Value>(v)
    {
        return Ok(parsed);
    }
    if has("string") || any {
        return Ok(Value::String(v.to_owned()));
    }
    Err(ConfigError::Cli {
        arg: arg.to_owned(),
        message: format!("expected {}, got {}", types.join(" or "), describe(&Value::String(v.to_owned()))),
    })
}
