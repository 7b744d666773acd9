//! Rows of one data file, by its extension: JSON Lines, a JSON array of objects (or JSON Lines
//! named `.json`, as `datasets` also takes), CSV or TSV, any of them gzipped (`.jsonl.gz`);
//! Parquet; Arrow (`datasets`' own files).

use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::row::{Row, kind, object};

/// A data file's format and whether it is gzipped, by its name (`None`: not a data file).
pub(crate) fn format_of(path: &Path) -> Option<(&'static str, bool)> {
    let name = path.file_name()?.to_str()?.to_ascii_lowercase();
    let (name, gz) = name.strip_suffix(".gz").map_or((name.as_str(), false), |n| (n, true));
    let format = match name.rsplit_once('.')?.1 {
        "parquet" if !gz => "parquet",
        "arrow" if !gz => "arrow",
        "jsonl" | "ndjson" => "jsonl",
        "json" => "json",
        "csv" => "csv",
        "tsv" => "tsv",
        _ => return None,
    };
    Some((format, gz))
}

/// Every row of a data file; an empty file is an error.
pub fn read_file(path: &Path) -> Result<Vec<Row>> {
    let Some((format, gz)) = format_of(path) else { return Err(Error::Unsupported { path: path.to_path_buf() }) };
    let rows = match format {
        "parquet" => crate::parquet_rows::read(path)?,
        "arrow" => crate::arrow_rows::read(path)?,
        "jsonl" => json_lines(path, &read_text(path, gz)?)?,
        "csv" => crate::csv_rows::read(path, &read_text(path, gz)?, b',')?,
        "tsv" => crate::csv_rows::read(path, &read_text(path, gz)?, b'\t')?,
        _ => json_file(path, &read_text(path, gz)?)?,
    };
    if rows.is_empty() {
        return Err(Error::Empty { path: path.to_path_buf() });
    }
    Ok(rows)
}

fn read_text(path: &Path, gz: bool) -> Result<String> {
    if !gz {
        return std::fs::read_to_string(path).map_err(|e| Error::io(path, e));
    }
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut text = String::new();
    flate2::read::MultiGzDecoder::new(file).read_to_string(&mut text).map_err(|e| Error::io(path, e))?;
    Ok(text)
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
    fn gzipped_json_lines_read_as_their_text() {
        use std::io::Write as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("train.jsonl.gz");
        let mut gz =
            flate2::write::GzEncoder::new(std::fs::File::create(&path).unwrap(), flate2::Compression::default());
        gz.write_all(b"{\"x\": 1}\n{\"x\": 2}\n").unwrap();
        gz.finish().unwrap();
        let rows = read_file(&path).unwrap();
        assert_eq!((rows.len(), rows[1].fields["x"].as_i64()), (2, Some(2)));
        assert!(rows[1].at.ends_with("train.jsonl.gz:2"), "{}", rows[1].at);
        assert_eq!(format_of(Path::new("d/x.JSON.GZ")), Some(("json", true)));
        assert_eq!(format_of(Path::new("d/x.gz")), None);
    }

    #[test]
    fn empty_and_unknown_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let err = read_file(&write(dir.path(), "a.jsonl", "\n\n")).unwrap_err().to_string();
        assert!(err.contains("has no rows"), "{err}");
        let err = read_file(&write(dir.path(), "a.xlsx", "x\n1\n")).unwrap_err().to_string();
        assert!(err.contains("a.xlsx: not a data file"), "{err}");
        let err = read_file(&write(dir.path(), "a.parquet.gz", "x")).unwrap_err().to_string();
        assert!(err.contains("not a data file"), "{err}");
        let err = read_file(&write(dir.path(), "b.jsonl.gz", "not gzip")).unwrap_err().to_string();
        assert!(err.contains("cannot read") && err.contains("b.jsonl.gz"), "{err}");
        let err = read_file(&write(dir.path(), "a.csv", "x\n")).unwrap_err().to_string();
        assert!(err.contains("a.csv has no rows"), "{err}");
        let err = read_file(&write(dir.path(), "a.arrow", "not arrow")).unwrap_err().to_string();
        assert!(err.contains("a.arrow: cannot read Arrow: not an Arrow IPC stream or file"), "{err}");
        let err = read_file(&dir.path().join("missing.jsonl")).unwrap_err().to_string();
        assert!(err.contains("cannot read") && err.contains("missing.jsonl"), "{err}");
    }
}
