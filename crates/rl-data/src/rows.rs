//! Rows of one data file, by its extension: JSON Lines, a JSON array of objects (or JSON Lines
//! named `.json`, as `datasets` also takes), or Parquet.

use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::row::{Row, kind, object};

/// Every row of a data file; an empty file is an error.
pub fn read_file(path: &Path) -> Result<Vec<Row>> {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or_default().to_ascii_lowercase();
    let rows = match ext.as_str() {
        "parquet" => crate::parquet_rows::read(path)?,
        "jsonl" | "ndjson" => json_lines(path, &read_text(path)?)?,
        "json" => json_file(path, &read_text(path)?)?,
        _ => return Err(Error::Unsupported { path: path.to_path_buf() }),
    };
    if rows.is_empty() {
        return Err(Error::Empty { path: path.to_path_buf() });
    }
    Ok(rows)
}

fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| Error::io(path, e))
}

/// One object per non-blank line.
fn json_lines(path: &Path, text: &str) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = format!("{}:{}", path.display(), i + 1);
        let value: Value =
            serde_json::from_str(line).map_err(|e| Error::Json { at: at.clone(), message: e.to_string() })?;
        rows.push(object(value, at)?);
    }
    Ok(rows)
}

/// A `.json` file: an array of objects, or else JSON Lines (what `datasets` accepts under that
/// name too).
fn json_file(path: &Path, text: &str) -> Result<Vec<Row>> {
    if !text.trim_start().starts_with('[') {
        return json_lines(path, text);
    }
    let value: Value = serde_json::from_str(text)
        .map_err(|e| Error::Json { at: path.display().to_string(), message: e.to_string() })?;
    match value {
        Value::Array(items) => {
            items.into_iter().enumerate().map(|(i, v)| object(v, format!("{} row {}", path.display(), i + 1))).collect()
        }
        other => Err(Error::NotAnObject { at: path.display().to_string(), got: kind(&other) }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn json_lines_skip_blank_lines_and_name_the_bad_line() {
        let dir = tempfile::tempdir().unwrap();
        let rows = read_file(&write(dir.path(), "a.jsonl", "{\"x\": 1}\n\n{\"x\": 2}\n")).unwrap();
        assert_eq!(rows.len(), 2);
        assert!(rows[1].at.ends_with("a.jsonl:3"), "{}", rows[1].at);
        let err = read_file(&write(dir.path(), "b.jsonl", "{\"x\": 1}\n[1]\n")).unwrap_err().to_string();
        assert!(err.contains("b.jsonl:2") && err.contains("got an array"), "{err}");
        let err = read_file(&write(dir.path(), "c.jsonl", "{\"x\": \n")).unwrap_err().to_string();
        assert!(err.contains("c.jsonl:1: not valid JSON"), "{err}");
    }

    #[test]
    fn a_json_file_is_an_array_or_json_lines() {
        let dir = tempfile::tempdir().unwrap();
        let rows = read_file(&write(dir.path(), "a.json", " [{\"x\": 1}, {\"x\": 2}]")).unwrap();
        assert_eq!(rows[1].fields["x"], 2);
        assert!(rows[1].at.ends_with("a.json row 2"));
        assert_eq!(read_file(&write(dir.path(), "b.json", "{\"x\": 1}\n{\"x\": 2}\n")).unwrap().len(), 2);
        let err = read_file(&write(dir.path(), "c.json", "[{\"x\": 1}, 3]")).unwrap_err().to_string();
        assert!(err.contains("c.json row 2") && err.contains("got a number"), "{err}");
    }

    #[test]
    fn empty_and_unknown_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let err = read_file(&write(dir.path(), "a.jsonl", "\n\n")).unwrap_err().to_string();
        assert!(err.contains("has no rows"), "{err}");
        let err = read_file(&write(dir.path(), "a.csv", "x\n1\n")).unwrap_err().to_string();
        assert!(err.contains("a.csv: not a data file"), "{err}");
        let err = read_file(&dir.path().join("missing.jsonl")).unwrap_err().to_string();
        assert!(err.contains("cannot read") && err.contains("missing.jsonl"), "{err}");
    }
}
