//! `rl <command> --help [section]`: every key of a command's config, nested and dotted as the
//! command line spells it, with its type, default and whole description, read from the config
//! type's JSON Schema (so help can never drift from what the loader accepts).

use std::fmt::Write as _;

use serde_json::Value;

/// One documented key.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Entry {
    /// Dotted key (`optim.lr`, `train.env.N.id`).
    pub(crate) key: String,
    /// Type as users write it (`number`, `string`, `"cpu" | "cuda"`, `section`, `list of sections`).
    pub(crate) ty: String,
    /// The default, as compact JSON.
    pub(crate) default: Option<String>,
    /// The whole description.
    pub(crate) about: String,
}

/// Every key of `schema`, depth first, sections before their keys.
pub(crate) fn entries(schema: &Value) -> Vec<Entry> {
    let mut out = Vec::new();
    walk(schema, schema, "", &mut out, 0);
    out
}

fn resolve<'a>(root: &'a Value, mut s: &'a Value) -> &'a Value {
    for _ in 0..32 {
        let Some(name) = s.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix("#/$defs/")) else {
            break;
        };
        match root.get("$defs").and_then(|d| d.get(name)) {
            Some(target) => s = target,
            None => break,
        }
    }
    s
}

/// The non-null alternatives of a schema, resolved.
fn variants<'a>(root: &'a Value, s: &'a Value) -> Vec<&'a Value> {
    let s = resolve(root, s);
    let mut out = Vec::new();
    let mut nested = false;
    for key in ["anyOf", "oneOf", "allOf"] {
        for v in s.get(key).and_then(Value::as_array).into_iter().flatten() {
            nested = true;
            out.extend(variants(root, v));
        }
    }
    if !nested || s.get("properties").is_some() {
        out.push(s);
    }
    out.retain(|v| v.get("type").and_then(Value::as_str) != Some("null"));
    out
}

fn walk(root: &Value, schema: &Value, prefix: &str, out: &mut Vec<Entry>, depth: usize) {
    if depth > 8 {
        return;
    }
    // Tagged unions (`type = "..."`): the keys of every variant, each marked with its variants
    // when not all of them have it.
    let structs: Vec<&Value> = variants(root, schema).into_iter().filter(|v| v.get("properties").is_some()).collect();
    let tag_of = |v: &Value| v.pointer("/properties/type/const").and_then(Value::as_str).map(str::to_owned);
    let mut seen: Vec<String> = Vec::new();
    for v in &structs {
        for (name, prop) in v.get("properties").and_then(Value::as_object).into_iter().flatten() {
            if seen.contains(name) {
                continue;
            }
            seen.push(name.clone());
            let owners: Vec<String> = structs
                .iter()
                .filter(|o| o.pointer(&format!("/properties/{name}")).is_some())
                .filter_map(|o| tag_of(o))
                .collect();
            let only = if owners.len() < structs.len() && !owners.is_empty() && name != "type" {
                format!(" (type = {})", owners.join(" | "))
            } else {
                String::new()
            };
            let key = if prefix.is_empty() { name.clone() } else { format!("{prefix}.{name}") };
            let tags: Vec<String> = structs.iter().filter_map(|o| tag_of(o)).map(|t| format!("{t:?}")).collect();
            if name == "type" && tags.len() > 1 {
                // The tag of a union: every variant's value.
                let about = String::from("Which variant this section is; the keys marked (type = ...) belong to it.");
                out.push(Entry { key, ty: tags.join(" | "), default: None, about });
                continue;
            }
            entry(root, prop, &key, &only, out, depth);
        }
    }
}

fn entry(root: &Value, prop: &Value, key: &str, only: &str, out: &mut Vec<Entry>, depth: usize) {
    let resolved = resolve(root, prop);
    let about = prop
        .get("description")
        .or_else(|| resolved.get("description"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let default = prop.get("default").map(Value::to_string);
    let alts = variants(root, prop);
    let is_section = alts.iter().any(|v| v.get("properties").is_some());
    let item = alts
        .iter()
        .find(|v| v.get("type").and_then(Value::as_str) == Some("array"))
        .and_then(|v| v.get("items"))
        .filter(|items| variants(root, items).iter().any(|v| v.get("properties").is_some()));
    if is_section {
        out.push(Entry { key: key.to_owned(), ty: String::from("section"), default: None, about: about + only });
        walk(root, prop, key, out, depth + 1);
    } else if let Some(items) = item {
        out.push(Entry { key: key.to_owned(), ty: String::from("list of sections"), default, about: about + only });
        walk(root, items, &format!("{key}.N"), out, depth + 1);
    } else {
        out.push(Entry { key: key.to_owned(), ty: type_name(root, prop), default, about: about + only });
    }
}

/// `number`, `"cpu" | "cuda"`, `list of string`, `table`...
fn type_name(root: &Value, prop: &Value) -> String {
    let mut names: Vec<String> = Vec::new();
    let mut optional = false;
    let s = resolve(root, prop);
    for key in ["anyOf", "oneOf"] {
        for v in s.get(key).and_then(Value::as_array).into_iter().flatten() {
            if v.get("type").and_then(Value::as_str) == Some("null") {
                optional = true;
            }
        }
    }
    for v in variants(root, prop) {
        if let Some(values) = v.get("enum").and_then(Value::as_array) {
            names.extend(values.iter().map(Value::to_string));
        } else if let Some(c) = v.get("const") {
            names.push(c.to_string());
        } else {
            match v.get("type") {
                Some(Value::String(t)) if t == "array" => {
                    let item = v.get("items").map_or_else(|| String::from("any"), |i| type_name(root, i));
                    names.push(format!("list of {item}"));
                }
                Some(Value::String(t)) if t == "object" => names.push(String::from("table")),
                Some(Value::String(t)) => names.push(t.clone()),
                Some(Value::Array(ts)) => {
                    for t in ts.iter().filter_map(Value::as_str) {
                        match t {
                            "null" => optional = true,
                            "array" => {
                                let item = v.get("items").map_or_else(|| String::from("any"), |i| type_name(root, i));
                                names.push(format!("list of {item}"));
                            }
                            "object" => names.push(String::from("table")),
                            _ => names.push(t.to_owned()),
                        }
                    }
                }
                _ => names.push(String::from("any")),
            }
        }
    }
    names.dedup();
    let mut ty = if names.is_empty() { String::from("any") } else { names.join(" | ") };
    if optional {
        ty.push_str(", optional");
    }
    ty
}

/// The help text: entries under `section` (dotted, `-` or `_`; all when `None`), descriptions
/// wrapped at 96 columns.
pub(crate) fn render(entries: &[Entry], section: Option<&str>) -> Option<String> {
    let section = section.map(|s| s.trim_start_matches("--").replace('-', "_"));
    let chosen: Vec<&Entry> = entries
        .iter()
        .filter(|e| section.as_deref().is_none_or(|s| e.key == s || e.key.starts_with(&format!("{s}."))))
        .collect();
    if chosen.is_empty() {
        return None;
    }
    let mut text = String::new();
    for e in chosen {
        let default = e.default.as_ref().map(|d| format!(", default {d}")).unwrap_or_default();
        let _ = writeln!(text, "  --{}  ({}{default})", e.key.replace('_', "-"), e.ty);
        for line in wrap(&e.about, 92) {
            let _ = writeln!(text, "      {line}");
        }
    }
    Some(text)
}

fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.len() + 1 + word.len() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_nested_key_is_listed_with_its_type_default_and_whole_description() {
        let schema = schemars::schema_for!(rl_configs::TrainerConfig).to_value();
        let all = entries(&schema);
        let find = |k: &str| all.iter().find(|e| e.key == k).unwrap_or_else(|| panic!("no {k}"));
        let lr = find("optim.lr");
        assert_eq!((lr.ty.as_str(), lr.default.as_deref()), ("number", Some("1e-6")));
        assert!(find("optim.betas").about.contains("(type = adamw)"));
        assert_eq!(find("ckpt").ty, "section");
        assert_eq!(find("ckpt.keep_last").ty, "integer, optional");
        let dtype = find("dtype");
        assert!(dtype.about.len() > 100, "not cut: {}", dtype.about);
        let text = render(&all, Some("optim")).unwrap();
        assert!(text.contains("--optim.lr  (number, default 1e-6)") && !text.contains("--dtype"), "{text}");
        assert!(render(&all, Some("nothing")).is_none());
        let tag = find("optim.type");
        assert_eq!(tag.ty, r#""adamw" | "sgd""#);
        let orch = entries(&schemars::schema_for!(rl_configs::OrchestratorConfig).to_value());
        assert!(orch.iter().any(|e| e.key == "train.env.N.id"), "list entries are spelled with N");
    }
}
