//! Which files of a dataset directory hold a split (and subset), read from their paths as the
//! `datasets` library reads a repository without a loading script: a split is named by a word of
//! the file's path (words lie between `-`, `.`, spaces, digits and `/`; `_` joins),
//! `train` also by `training`, `validation` by `valid` / `dev` / `val`, `test` by `testing` /
//! `eval` / `evaluation`; `data/train_sft-00000-of-00003.parquet` is split `train_sft`. When no
//! file names any split, every file is `train`. A subset (a config) is a folder of that name.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// JSON files of a dataset directory that are metadata, not rows (the `datasets` library's own).
const METADATA: [&str; 5] =
    ["dataset_info.json", "dataset_infos.json", "dataset_dict.json", "state.json", "config.json"];

/// The standard splits and the words that name each.
const KEYWORDS: [&[&str]; 3] =
    [&["train", "training"], &["validation", "valid", "dev", "val"], &["test", "testing", "eval", "evaluation"]];

/// The data files of `split` under `root`, in path order, narrowed to the folders named in
/// `subsets` when there are any.
pub fn split_files(root: &Path, subsets: &[String], split: &str) -> Result<Vec<PathBuf>> {
    let mut all = Vec::new();
    walk(root, root, &mut std::collections::HashSet::new(), &mut all)?;
    all.sort();
    let in_subset: Vec<&String> =
        all.iter().filter(|rel| subsets.is_empty() || folders(rel).any(|f| subsets.iter().any(|s| s == f))).collect();
    let names = names_of(split);
    // A shard `push_to_hub` wrote names its split exactly; other files by their path words.
    let of_split = |rel: &&String| match shard_split(rel) {
        Some(shard) => shard == split,
        None => names_split(rel, &names),
    };
    let mut picked: Vec<&String> = in_subset.iter().copied().filter(of_split).collect();
    let names_any_split =
        || in_subset.iter().any(|rel| shard_split(rel).is_some() || KEYWORDS.iter().any(|k| names_split(rel, k)));
    if picked.is_empty() && split == "train" && !names_any_split() {
        picked = in_subset;
    }
    if picked.is_empty() {
        let shown: Vec<&str> = all.iter().take(20).map(String::as_str).collect();
        return Err(Error::NoSplit {
            root: root.to_path_buf(),
            split: split.to_owned(),
            subsets: if subsets.is_empty() { String::new() } else { format!(" in subsets {}", subsets.join(", ")) },
            found: if shown.is_empty() {
                String::from("none")
            } else {
                format!("{}{}", shown.join(", "), if all.len() > 20 { ", ..." } else { "" })
            },
        });
    }
    Ok(picked.into_iter().map(|rel| root.join(rel)).collect())
}

/// The split of a shard `push_to_hub` wrote (`data/<split>-00000-of-00003.parquet`, or
/// `<config>/<split>-...` for a named config), as the `datasets` library's
/// `{split}-[0-9]{5}-of-[0-9]{5}*` shard names read.
fn shard_split(rel: &str) -> Option<&str> {
    let file = rel.rsplit('/').next().unwrap_or(rel);
    let (split, rest) = file.split_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    let rest = rest.as_bytes();
    let ok = rest.len() > 14
        && digits(std::str::from_utf8(&rest[..5]).ok()?)
        && &rest[5..9] == b"-of-"
        && digits(std::str::from_utf8(&rest[9..14]).ok()?);
    (ok && !split.is_empty()).then_some(split)
}

/// The words naming `split`: a standard split's keywords, or the name itself.
fn names_of(split: &str) -> Vec<&str> {
    KEYWORDS.iter().find(|k| k.contains(&split)).map_or_else(|| vec![split], |k| k.to_vec())
}

/// Whether a word of the relative path `rel` is one of `names`.
fn names_split(rel: &str, names: &[&str]) -> bool {
    rel.split(|c: char| "-. /".contains(c) || c.is_ascii_digit())
        .any(|w| !w.is_empty() && names.iter().any(|n| n.eq_ignore_ascii_case(w)))
}

/// The folder names of a relative path (not its file name).
fn folders(rel: &str) -> impl Iterator<Item = &str> {
    let mut parts: Vec<&str> = rel.split('/').collect();
    parts.pop();
    parts.into_iter()
}

/// Data files under `dir`, relative to `root` with `/` separators; hidden and `__` entries skipped.
/// Symlinks are followed (the hub cache's snapshot files link to its blobs), each folder read once
/// (`seen`: canonical paths), so a link back up the tree neither loops nor repeats rows.
fn walk(root: &Path, dir: &Path, seen: &mut std::collections::HashSet<PathBuf>, out: &mut Vec<String>) -> Result<()> {
    if !seen.insert(std::fs::canonicalize(dir).map_err(|e| Error::io(dir, e))?) {
        return Ok(());
    }
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name.starts_with("__") {
            continue;
        }
        let path = entry.path();
        if path.is_dir() {
            walk(root, &path, seen, out)?;
            continue;
        }
        // `cache-<fingerprint>.arrow`: a `map` result `datasets` cached, not the dataset's rows.
        let map_cache = name.starts_with("cache-") && name.ends_with(".arrow");
        if crate::rows::format_of(&path).is_some() && !METADATA.contains(&name.as_str()) && !map_cache {
            let rel = path.strip_prefix(root).unwrap_or(&path);
            out.push(rel.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dataset(files: &[&str]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for f in files {
            let path = dir.path().join(f);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, "{}\n").unwrap();
        }
        dir
    }

    fn picked(dir: &tempfile::TempDir, subsets: &[&str], split: &str) -> Vec<String> {
        let subsets: Vec<String> = subsets.iter().map(|s| s.to_string()).collect();
        split_files(dir.path(), &subsets, split)
            .unwrap()
            .iter()
            .map(|p| p.strip_prefix(dir.path()).unwrap().to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn push_to_hub_shards_and_keyword_names() {
        let d = dataset(&[
            "README.md",
            "data/train-00000-of-00002.parquet",
            "data/train-00001-of-00002.parquet",
            "data/test-00000-of-00001.parquet",
            "data/train_sft-00000-of-00001.parquet",
            "valid.jsonl",
            ".cache/train.jsonl",
            "dataset_info.json",
        ]);
        assert_eq!(
            picked(&d, &[], "train"),
            ["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet"]
        );
        assert_eq!(picked(&d, &[], "test"), ["data/test-00000-of-00001.parquet"]);
        assert_eq!(picked(&d, &[], "train_sft"), ["data/train_sft-00000-of-00001.parquet"]);
        assert_eq!(picked(&d, &[], "validation"), ["valid.jsonl"]);
        let err = split_files(d.path(), &[], "gen").unwrap_err().to_string();
        assert!(err.contains("no data files for split `gen`") && err.contains("valid.jsonl"), "{err}");
    }

    /// ultrachat_200k's layout: splits named only by their shards, none of them `train`.
    #[test]
    fn shard_names_are_splits_of_their_own() {
        let d = dataset(&[
            "data/train_sft-00000-of-00003.parquet",
            "data/train_sft-00001-of-00003.parquet",
            "data/test_sft-00000-of-00001.parquet",
            "data/train_gen-00000-of-00001.parquet",
        ]);
        assert_eq!(picked(&d, &[], "train_sft").len(), 2);
        assert_eq!(picked(&d, &[], "test_sft"), ["data/test_sft-00000-of-00001.parquet"]);
        let err = split_files(d.path(), &[], "train").unwrap_err().to_string();
        assert!(err.contains("no data files for split `train`"), "not every file as train: {err}");
        assert_eq!(shard_split("main/data/train-00000-of-00001.parquet"), Some("train"));
        assert_eq!(shard_split("socratic/test-00000-of-00001.parquet"), Some("test"));
        assert_eq!(shard_split("data/train-0-of-1.parquet"), None);
        assert_eq!(shard_split("data/train.parquet"), None);
        let configs = dataset(&["main/train_sft-00000-of-00001.parquet", "main/test_sft-00000-of-00001.parquet"]);
        assert!(split_files(configs.path(), &[String::from("main")], "train").is_err());
    }

    #[test]
    fn unnamed_files_are_train_and_subsets_are_folders() {
        let d = dataset(&["rows.jsonl", "more/rows2.parquet"]);
        assert_eq!(picked(&d, &[], "train"), ["more/rows2.parquet", "rows.jsonl"]);
        assert!(split_files(d.path(), &[], "test").is_err());
        let d =
            dataset(&["main/train-00000-of-00001.parquet", "socratic/train-00000-of-00001.parquet", "main/test.jsonl"]);
        assert_eq!(picked(&d, &["main"], "train"), ["main/train-00000-of-00001.parquet"]);
        assert_eq!(picked(&d, &["main", "socratic"], "train").len(), 2);
        assert_eq!(picked(&d, &["main"], "test"), ["main/test.jsonl"]);
        let err = split_files(d.path(), &[String::from("other")], "train").unwrap_err().to_string();
        assert!(err.contains("in subsets other"), "{err}");
    }

    /// `datasets`' cache of a prepared dataset: a file per split, and `map` results beside them.
    #[test]
    fn a_datasets_cache_folder_reads_by_split_without_map_caches() {
        let d = dataset(&[
            "gsm8k/main/0.0.0/abc123/gsm8k-train.arrow",
            "gsm8k/main/0.0.0/abc123/gsm8k-test.arrow",
            "gsm8k/main/0.0.0/abc123/cache-9f86d081884c7d65.arrow",
            "gsm8k/main/0.0.0/abc123/dataset_info.json",
        ]);
        assert_eq!(picked(&d, &[], "train"), ["gsm8k/main/0.0.0/abc123/gsm8k-train.arrow"]);
        assert_eq!(picked(&d, &[], "test"), ["gsm8k/main/0.0.0/abc123/gsm8k-test.arrow"]);
    }

    #[cfg(unix)]
    #[test]
    fn a_folder_linking_to_itself_ends() {
        let d = dataset(&["data/train.jsonl"]);
        std::os::unix::fs::symlink(d.path().join("data"), d.path().join("data/loop")).unwrap();
        assert_eq!(picked(&d, &[], "train"), ["data/train.jsonl"], "read once, not once per loop");
    }

    #[test]
    fn words_are_whole() {
        assert!(names_split("data/train-00000-of-00001.parquet", &["train"]));
        assert!(names_split("Training_set/x.jsonl", &["training_set"]));
        assert!(!names_split("constrained/x.jsonl", &["train"]));
        assert!(!names_split("data/train_sft-0.parquet", &["train"]));
        assert!(names_split("dev.json", &names_of("validation")));
    }
}
