//! Dataset files as users hold them: rows of JSONL, JSON, Parquet, CSV and Arrow files, Hugging
//! Face dataset repositories on disk (a `hf download --local-dir` directory, or the hub cache that
//! `huggingface_hub` fills), with their subsets and splits picked from file names the way the
//! `datasets` library does, and `datasets`' own `save_to_disk` directories; and model hub ids looked up in the same cache. Nothing is downloaded:
//! a hub id is looked up in the local cache and its absence is an error that says how to fetch it.
//!
//! One owner for "dataset on disk -> JSON rows": `rl sft`'s `type = "hf"` data and the `dataset`
//! env read through here, and every error names the file (and the line or row).

mod arrow_column;
mod arrow_rows;
mod calendar;
mod csv_rows;
mod error;
mod hub;
mod parquet_rows;
mod row;
mod rows;
mod saved;
mod splits;

use std::path::{Path, PathBuf};

pub use calendar::civil_from_days;
pub use error::{Error, Result};
pub use hub::{cached_model, cached_model_in, hub_cache_dir, locate, locate_in, looks_like_hub_id};
pub use row::Row;
pub use rows::read_file;
pub use splits::split_files;

/// Whether `path` names a data file this crate reads (`.parquet`, `.arrow`, `.jsonl`, `.ndjson`,
/// `.json`, `.csv`, `.tsv`, the text ones optionally gzipped), by its name.
pub fn is_data_file(path: &Path) -> bool {
    rows::format_of(path).is_some()
}

/// Every row of `splits` (in order; each split's files in path order) of the dataset `name`: a
/// data file, a dataset directory (a repository's files, or a `save_to_disk` directory), or a hub
/// id (`org/name`) in the local hub cache. `subsets`
/// (the `datasets` library's configs) narrow a directory to the files under a folder of one of
/// those names; empty: every file.
pub fn load(name: &str, subsets: &[String], splits: &[String]) -> Result<Vec<Row>> {
    let root = locate(name)?;
    let mut rows = Vec::new();
    for file in files_of(&root, subsets, splits)? {
        rows.extend(read_file(&file)?);
    }
    Ok(rows)
}

/// The data files `load` reads, without reading them.
pub fn files_of(root: &Path, subsets: &[String], splits: &[String]) -> Result<Vec<PathBuf>> {
    if root.is_file() {
        // One file is one split's rows; asking it for another split or a subset would be ignored.
        if subsets.is_empty() && splits.iter().all(|s| s == "train") {
            return Ok(vec![root.to_path_buf()]);
        }
        return Err(Error::SplitOfFile {
            path: root.to_path_buf(),
            asked: subsets
                .iter()
                .map(|s| format!("subset `{s}`"))
                .chain(splits.iter().map(|s| format!("split `{s}`")))
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    if let Some(files) = saved::files(root, subsets, splits)? {
        return Ok(files);
    }
    let mut files = Vec::new();
    for split in splits {
        files.extend(split_files(root, subsets, split)?);
    }
    Ok(files)
}
