//! rl-data against files the `datasets` library and pyarrow wrote (`tests/fixtures/make_fixtures.py`):
//! a dataset's shards as `to_parquet` writes them (nested columns, several row groups, its
//! features in the metadata), every codec, a hub-cache layout; `datasets_lib` its own formats.

mod datasets_lib;
mod malformed;

use std::path::{Path, PathBuf};

use serde_json::json;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

#[test]
fn nested_chat_rows_read_as_json_across_row_groups() {
    let rows = rl_data::read_file(&fixtures().join("data/train-00000-of-00001.parquet")).unwrap();
    assert_eq!(rows.len(), 3, "two row groups, three rows");
    assert_eq!(
        rows[0].fields["messages"],
        json!([
            {"role": "user", "content": "Reverse: abc", "tool_calls": null},
            {"role": "assistant", "content": "cba", "tool_calls": null}
        ])
    );
    let call = &rows[1].fields["messages"][2];
    assert_eq!(call["content"], json!(null));
    assert_eq!(call["tool_calls"][0]["function"], json!({"name": "lookup", "arguments": "{\"word\": \"ütf\"}"}));
    assert_eq!(rows[1].fields["tools"].as_str().map(|t| t.contains("\"lookup\"")), Some(true));
    assert_eq!(rows[2].fields["score"], json!(3), "the third row is in the second row group");
    assert!(rows[2].at.ends_with("train-00000-of-00001.parquet row 3"), "{}", rows[2].at);
}

#[test]
fn every_codec_pyarrow_writes_reads() {
    let test = rl_data::read_file(&fixtures().join("data/test-00000-of-00001.parquet")).unwrap();
    assert_eq!(test[0].fields["completion"], json!([{"role": "assistant", "content": "4"}]));
    assert_eq!(test[0].fields["weight"], json!(0.5));
    assert_eq!(test[1].fields["weight"], json!(null));
    for codec in ["zstd", "lz4", "gzip"] {
        let rows = rl_data::read_file(&fixtures().join(format!("{codec}.parquet"))).unwrap();
        let got: Vec<_> = rows.iter().map(|r| r.fields["answer"].clone()).collect();
        assert_eq!(got, [json!("1"), json!("2")], "{codec}");
    }
}

#[test]
fn a_dataset_directory_is_read_by_split() {
    let root = fixtures().to_string_lossy().into_owned();
    let train = rl_data::load(&root, &[], &[String::from("train")]).unwrap();
    assert_eq!(train.len(), 3);
    let both = rl_data::load(&root, &[], &[String::from("train"), String::from("test")]).unwrap();
    assert_eq!(both.len(), 5);
    assert!(both[4].at.contains("test-00000-of-00001.parquet"));
}

#[test]
fn a_single_file_is_the_train_split_and_nothing_else() {
    let file = fixtures().join("lz4.parquet").to_string_lossy().into_owned();
    assert_eq!(rl_data::load(&file, &[], &[String::from("train")]).unwrap().len(), 2);
    let err = rl_data::load(&file, &[], &[String::from("test")]).unwrap_err().to_string();
    assert!(err.contains("lz4.parquet is one data file") && err.contains("no split `test`"), "{err}");
    let err = rl_data::load(&file, &[String::from("main")], &[String::from("train")]).unwrap_err().to_string();
    assert!(err.contains("no subset `main`"), "{err}");
}

#[test]
fn a_hub_id_is_read_from_the_hub_cache() {
    // The layout huggingface_hub writes; the cache is given, not read from the environment.
    let cache = tempfile::tempdir().unwrap();
    let repo = cache.path().join("datasets--org--chat");
    let snapshot = repo.join("snapshots/0123abcd/data");
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), "0123abcd").unwrap();
    // As huggingface_hub stores files: the content in blobs/, the snapshot's file a relative link to it.
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::copy(fixtures().join("data/train-00000-of-00001.parquet"), repo.join("blobs/9f8e7d")).unwrap();
    link("../../../blobs/9f8e7d", &snapshot.join("train-00000-of-00001.parquet"));
    let found = rl_data::locate_in("org/chat", Some(cache.path())).unwrap();
    assert!(found.ends_with("snapshots/0123abcd"));
    assert_eq!(rl_data::load(&found.to_string_lossy(), &[], &[String::from("train")]).unwrap().len(), 3);
}

#[cfg(unix)]
fn link(target: &str, at: &Path) {
    std::os::unix::fs::symlink(target, at).unwrap();
}

#[cfg(not(unix))]
fn link(target: &str, at: &Path) {
    std::fs::copy(at.parent().unwrap().join(target), at).unwrap();
}

#[test]
fn a_broken_file_names_itself() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.parquet");
    std::fs::write(&path, b"PAR1 not really").unwrap();
    let err = rl_data::read_file(&path).unwrap_err().to_string();
    assert!(err.contains("bad.parquet: cannot read Parquet"), "{err}");
}
