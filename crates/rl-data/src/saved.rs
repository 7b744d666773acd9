//! `datasets`' `save_to_disk` directories, read as `load_from_disk` reads them: a `DatasetDict`
//! (`dataset_dict.json` naming its splits, a folder each) or one `Dataset` (`state.json` listing
//! its Arrow shards in order).

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Error, Result};

/// The Arrow files of `splits` when `root` is a `save_to_disk` directory; `None` when it is not.
pub(crate) fn files(root: &Path, subsets: &[String], splits: &[String]) -> Result<Option<Vec<PathBuf>>> {
    let dict = root.join("dataset_dict.json");
    let state = root.join("state.json");
    if !dict.is_file() && !state.is_file() {
        return Ok(None);
    }
    let fail = |message: String| Error::Saved { root: root.to_path_buf(), message };
    if !subsets.is_empty() {
        return Err(fail(format!(
            "a save_to_disk directory has splits but no subsets (configs); asked for subsets {}",
            subsets.join(", ")
        )));
    }
    let mut files = Vec::new();
    if dict.is_file() {
        let names = split_names(&dict)?;
        for split in splits {
            if !names.contains(split) {
                return Err(fail(format!("no split `{split}` (dataset_dict.json names {})", names.join(", "))));
            }
            files.extend(shards(&root.join(split))?);
        }
    } else {
        // One Dataset is one split: `train`, or the split it was cut from.
        let own = text_field(&state, "_split")?;
        for split in splits {
            if split != "train" && own.as_deref() != Some(split.as_str()) {
                return Err(fail(format!(
                    "a saved Dataset (not a DatasetDict) is one split{}; it has no split `{split}` (save a \
                     DatasetDict, or give each split's directory)",
                    own.as_ref().map_or(String::new(), |s| format!(", `{s}`"))
                )));
            }
            files.extend(shards(root)?);
        }
    }
    Ok(Some(files))
}

fn json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| Error::Json { at: path.display().to_string(), message: e.to_string() })
}

/// `dataset_dict.json`'s `splits`.
fn split_names(path: &Path) -> Result<Vec<String>> {
    let value = json(path)?;
    let names = value
        .get("splits")
        .and_then(Value::as_array)
        .and_then(|s| s.iter().map(|n| n.as_str().map(str::to_owned)).collect::<Option<Vec<_>>>());
    names.ok_or_else(|| Error::Json {
        at: path.display().to_string(),
        message: String::from("expected `splits`, a list of names"),
    })
}

/// A text field of a JSON file (`None` when null or absent).
fn text_field(path: &Path, key: &str) -> Result<Option<String>> {
    Ok(json(path)?.get(key).and_then(Value::as_str).map(str::to_owned))
}

/// The Arrow shards `state.json` in `dir` lists, in its order.
fn shards(dir: &Path) -> Result<Vec<PathBuf>> {
    let state = dir.join("state.json");
    let value = json(&state)?;
    let listed = value.get("_data_files").and_then(Value::as_array).and_then(|files| {
        files.iter().map(|f| f.get("filename").and_then(Value::as_str).map(|n| dir.join(n))).collect::<Option<Vec<_>>>()
    });
    match listed {
        Some(files) if !files.is_empty() => Ok(files),
        _ => Err(Error::Json {
            at: state.display().to_string(),
            message: String::from("expected `_data_files`, a list of `{\"filename\": ...}` (a save_to_disk state)"),
        }),
    }
}
