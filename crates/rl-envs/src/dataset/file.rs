//! Task rows from JSONL files: one JSON object per line, with errors naming the file, the line and
//! the field.

use std::path::Path;

use rl_serve::{Error, Result};
use serde_json::{Map, Value};

/// One task: its prompt text, its reference answer, and the whole row (sent back on traces).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Row {
    pub(crate) prompt: String,
    pub(crate) answer: String,
    pub(crate) data: Value,
}

/// Which fields of a row hold the prompt and the answer.
#[derive(Debug, Clone)]
pub(crate) struct Fields {
    pub(crate) prompt: String,
    pub(crate) answer: String,
}

/// Reads every row of `path`; `arg` names the env argument that gave the path.
pub(crate) fn read_rows(path: &Path, fields: &Fields, arg: &str) -> Result<Vec<Row>> {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or_default();
    if ext == "parquet" {
        return Err(Error::bad_request(
            arg,
            format!(
                "{}: parquet is read by the Python SDK (rl_env.load_dataset, env id `python`); \
                 for this env convert it to JSONL",
                path.display()
            ),
        ));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::bad_request(arg, format!("cannot read {}: {e}", path.display())))?;
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{}:{}", path.display(), i + 1);
        let value: Value = serde_json::from_str(line)
            .map_err(|e| Error::bad_request(arg, format!("{}: not valid JSON: {e}", at())))?;
        let Value::Object(obj) = value else {
            return Err(Error::bad_request(arg, format!("{}: expected a JSON object", at())));
        };
        let prompt = text_field(&obj, &fields.prompt).map_err(|m| Error::bad_request(arg, format!("{}: {m}", at())))?;
        let answer = text_field(&obj, &fields.answer).map_err(|m| Error::bad_request(arg, format!("{}: {m}", at())))?;
        rows.push(Row { prompt, answer, data: Value::Object(obj) });
    }
    if rows.is_empty() {
        return Err(Error::bad_request(arg, format!("{} has no rows", path.display())));
    }
    Ok(rows)
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
