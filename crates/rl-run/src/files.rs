//! The one way files of a run are written: whole files atomically (temp file in the same
//! directory, fsync, rename, fsync of the directory) so a reader or a crash never sees half of
//! one; JSON-lines files by appending whole lines, and rewritten atomically when a resume drops rows.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// A run file could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// An I/O error on `path`.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A line of a JSON-lines file is not the expected JSON.
    #[error("{}:{line}: {source}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The parse error.
        source: serde_json::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> FileError + '_ {
    move |source| FileError::Io { path: path.to_owned(), source }
}

/// Writes `bytes` to `path` so that `path` holds either its old content or all of `bytes`, also
/// across a crash: temp file beside it, fsync, rename, fsync of the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), FileError> {
    let tmp = temp_path(path);
    if let Some(dir) = tmp.parent() {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    if let Err(e) = std::fs::write(&tmp, bytes) {
        let _ = std::fs::remove_file(&tmp);
        return Err(FileError::Io { path: tmp, source: e });
    }
    persist(&tmp, path)
}

/// A temp path beside `path` (same directory, so the final rename is atomic).
pub fn temp_path(path: &Path) -> PathBuf {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    dir.join(format!(".{name}.tmp.{}", std::process::id()))
}

/// Makes a finished temp file or directory the real one: fsync of its content, rename onto
/// `path` (a file in the way is replaced), fsync of the directory. The temp is removed on failure.
pub fn persist(tmp: &Path, path: &Path) -> Result<(), FileError> {
    let done = sync_tree(tmp).and_then(|()| std::fs::rename(tmp, path));
    if let Err(e) = done {
        let _ = if tmp.is_dir() { std::fs::remove_dir_all(tmp) } else { std::fs::remove_file(tmp) };
        return Err(FileError::Io { path: path.to_owned(), source: e });
    }
    sync_dir(path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new(".")))
}

/// fsync of a file, or of a directory's files and the directory itself.
fn sync_tree(path: &Path) -> std::io::Result<()> {
    if path.is_dir() {
        for entry in std::fs::read_dir(path)? {
            sync_tree(&entry?.path())?;
        }
    }
    std::fs::File::open(path)?.sync_all()
}

/// Makes a rename or a new entry in `dir` durable.
fn sync_dir(dir: &Path) -> Result<(), FileError> {
    // Directories can be opened read-only and fsynced on Unix; elsewhere this is best effort.
    match std::fs::File::open(dir) {
        Ok(d) => match d.sync_all() {
            Ok(()) => Ok(()),
            Err(e) if cfg!(unix) => Err(FileError::Io { path: dir.to_owned(), source: e }),
            Err(_) => Ok(()),
        },
        Err(e) => Err(FileError::Io { path: dir.to_owned(), source: e }),
    }
}

/// Writes `value` as pretty JSON (with a final newline) atomically.
pub fn write_json_atomic(path: &Path, value: &impl Serialize) -> Result<(), FileError> {
    let mut text = serde_json::to_string_pretty(value).map_err(|e| FileError::Json {
        path: path.to_owned(),
        line: 0,
        source: e,
    })?;
    text.push('\n');
    write_atomic(path, text.as_bytes())
}

/// Appends `row` as one JSON line (creating the file and its directory). The line goes out in one
/// write and is synced: a reader sees whole lines, or a torn last line it skips.
pub fn append_jsonl(path: &Path, row: &impl Serialize) -> Result<(), FileError> {
    let mut line =
        serde_json::to_string(row).map_err(|e| FileError::Json { path: path.to_owned(), line: 0, source: e })?;
    line.push('\n');
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    // A torn last line (a crash mid-append) would glue onto this row: cut it first.
    repair_jsonl(path)?;
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(io(path))?;
    f.write_all(line.as_bytes()).map_err(io(path))?;
    f.sync_data().map_err(io(path))
}

/// Cuts a torn last line (bytes after the last newline, left by a crash mid-append) off a JSON-lines
/// file, returning what was cut so the caller can report it; `None` when the file is whole or
/// missing. Each JSONL file has one writer, so a tail without a newline is never a row in progress
/// when its writer calls this.
pub fn repair_jsonl(path: &Path) -> Result<Option<String>, FileError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(FileError::Io { path: path.to_owned(), source: e }),
    };
    if bytes.is_empty() || bytes.ends_with(b"\n") {
        return Ok(None);
    }
    let keep = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    let f = std::fs::OpenOptions::new().write(true).open(path).map_err(io(path))?;
    f.set_len(keep as u64).map_err(io(path))?;
    f.sync_data().map_err(io(path))?;
    Ok(Some(String::from_utf8_lossy(&bytes[keep..]).into_owned()))
}

/// The rows of a JSON-lines file (none when it does not exist). A last line without its newline is
/// being written right now and is skipped; any other bad line is an error naming file and line.
pub fn read_jsonl<T: DeserializeOwned>(path: &Path) -> Result<Vec<T>, FileError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(FileError::Io { path: path.to_owned(), source: e }),
    };
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| FileError::Json { path: path.to_owned(), line: i + 1, source: e })
        })
        .collect()
}

/// What [`retain_jsonl`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Retained {
    /// Whole rows dropped.
    pub dropped: usize,
    /// A torn last line cut off (a crash mid-append), to report.
    pub torn: Option<String>,
}

/// Keeps only the rows of a JSON-lines file for which `keep` is true, rewriting it atomically (a
/// missing file stays missing); a torn last line is cut and returned for the caller to report.
pub fn retain_jsonl(path: &Path, keep: impl Fn(&Value) -> bool) -> Result<Retained, FileError> {
    if !path.exists() {
        return Ok(Retained::default());
    }
    let torn = repair_jsonl(path)?;
    let rows: Vec<Value> = read_jsonl(path)?;
    let before = rows.len();
    let mut out = String::new();
    for row in rows.iter().filter(|r| keep(r)) {
        out.push_str(&row.to_string());
        out.push('\n');
    }
    let kept = out.lines().count();
    write_atomic(path, out.as_bytes())?;
    Ok(Retained { dropped: before - kept, torn })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rl-files-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_torn_last_line_is_cut_before_the_next_append_and_reported() {
        let d = tmp("torn");
        let p = d.join("m.jsonl");
        append_jsonl(&p, &json!({"step": 1})).unwrap();
        std::fs::OpenOptions::new().append(true).open(&p).unwrap().write_all(br#"{"step": 2, "los"#).unwrap();
        assert_eq!(read_jsonl::<Value>(&p).unwrap().len(), 1, "readers skip it");
        append_jsonl(&p, &json!({"step": 2})).unwrap();
        let rows: Vec<Value> = read_jsonl(&p).unwrap();
        assert_eq!(rows, vec![json!({"step": 1}), json!({"step": 2})]);
        std::fs::OpenOptions::new().append(true).open(&p).unwrap().write_all(b"{\"st").unwrap();
        assert_eq!(repair_jsonl(&p).unwrap().as_deref(), Some("{\"st"));
        assert_eq!(repair_jsonl(&p).unwrap(), None, "whole now");
        assert_eq!(repair_jsonl(&d.join("missing.jsonl")).unwrap(), None);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn atomic_writes_replace_whole_files_and_leave_no_temp_files() {
        let d = tmp("atomic");
        let p = d.join("sub").join("a.json");
        write_atomic(&p, b"one").unwrap();
        write_json_atomic(&p, &json!({"x": 1})).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "{\n  \"x\": 1\n}\n");
        let names: Vec<_> = std::fs::read_dir(d.join("sub")).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("a.json")]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn jsonl_round_trips_skips_a_torn_last_line_and_names_bad_lines() {
        let d = tmp("jsonl");
        let p = d.join("m.jsonl");
        assert!(read_jsonl::<Value>(&p).unwrap().is_empty(), "a missing file has no rows");
        for s in 1..=3 {
            append_jsonl(&p, &json!({"step": s})).unwrap();
        }
        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(b"{\"step\": 4").unwrap();
        let rows: Vec<Value> = read_jsonl(&p).unwrap();
        assert_eq!(rows, vec![json!({"step": 1}), json!({"step": 2}), json!({"step": 3})]);
        std::fs::write(&p, "{\"step\": 1}\nnot json\n").unwrap();
        let err = read_jsonl::<Value>(&p).unwrap_err().to_string();
        assert!(err.contains("m.jsonl:2"), "{err}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn retain_drops_rows_atomically() {
        let d = tmp("retain");
        let p = d.join("m.jsonl");
        for s in 1..=4 {
            append_jsonl(&p, &json!({"step": s})).unwrap();
        }
        let dropped = retain_jsonl(&p, |r| r["step"].as_u64().is_some_and(|s| s <= 2)).unwrap().dropped;
        assert_eq!(dropped, 2);
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "{\"step\":1}\n{\"step\":2}\n");
        assert_eq!(retain_jsonl(&d.join("none.jsonl"), |_| true).unwrap(), Retained::default());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
