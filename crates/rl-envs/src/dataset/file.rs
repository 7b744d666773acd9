//! Task rows from a data file (JSONL, JSON, Parquet, CSV or Arrow) or a Hugging Face dataset's split, read by
//! `rl-data`, with errors naming the env argument, the file, the row and the field.

use std::path::Path;

use rl_serve::{Error, Message, Result};
use serde_json::{Map, Value};

/// One task: the whole row (sent back on traces), its prompt and answer fields checked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Row {
    pub(crate) data: Value,
}

/// Which fields of a row hold the prompt and the answer.
#[derive(Debug, Clone)]
pub(crate) struct Fields {
    pub(crate) prompt: String,
    pub(crate) answer: String,
}

/// Where the rows of a split come from.
#[derive(Debug, Clone)]
pub(crate) enum Source<'a> {
    /// One data file.
    File(&'a Path),
    /// A split of a dataset (a hub id in the local hub cache, or a directory), narrowed to subsets.
    Dataset { name: &'a str, subsets: &'a [String], split: &'a str },
}

/// Every row of `source`; `arg` names the env argument that gave it.
pub(crate) fn read_rows(source: &Source<'_>, fields: &Fields, arg: &str) -> Result<Vec<Row>> {
    let rows = match source {
        Source::File(path) => rl_data::read_file(path),
        Source::Dataset { name, subsets, split } => rl_data::load(name, subsets, &[(*split).to_owned()]),
    }
    .map_err(|e| Error::bad_request(arg, e.to_string()))?;
    rows.into_iter()
        .map(|row| {
            let fail = |m: String| Error::bad_request(arg, format!("{}: {m}", row.at));
            prompt_messages(&row.fields, &fields.prompt).map_err(fail)?;
            text_field(&row.fields, &fields.answer).map_err(fail)?;
            Ok(Row { data: Value::Object(row.fields) })
        })
        .collect()
}

/// The prompt field: a text (the user's message), or a list of chat messages as verifiers and
/// TRL datasets hold conversational prompts (`[{"role": "system", ...}, {"role": "user", ...}]`).
pub(crate) fn prompt_messages(obj: &Map<String, Value>, field: &str) -> std::result::Result<Vec<Message>, String> {
    match obj.get(field) {
        Some(Value::Array(items)) if !items.is_empty() => items
            .iter()
            .enumerate()
            .map(|(i, m)| {
                Message::from_json(m, &format!("{field}[{i}]")).map_err(|e| match e {
                    Error::BadRequest { field, message } => format!("`{field}` {message}"),
                    other => other.to_string(),
                })
            })
            .collect(),
        Some(Value::Array(_)) => Err(format!("field `{field}` is an empty message list")),
        Some(other @ (Value::Object(_) | Value::Bool(_) | Value::Null)) => {
            Err(format!("field `{field}` must be a string, a number or a list of chat messages, got {other}"))
        }
        _ => text_field(obj, field).map(|text| vec![Message::user(text)]),
    }
}

/// A field that must be text (a number is taken as its decimal text).
pub(crate) fn text_field(obj: &Map<String, Value>, field: &str) -> std::result::Result<String, String> {
    match obj.get(field) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Number(n)) => Ok(n.to_string()),
        Some(other) => Err(format!("field `{field}` must be a string or a number, got {other}")),
        None => {
            let mut have: Vec<&str> = obj.keys().map(String::as_str).collect();
            have.sort_unstable();
            Err(format!("missing field `{field}` (the row has: {})", have.join(", ")))
        }
    }
}
