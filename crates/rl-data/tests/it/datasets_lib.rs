//! `datasets`' own formats (`save_to_disk` directories, CSV and TSV read through its csv loader)
//! against the rows `datasets` itself gives for the same files (`datasets_lib/expected.json`,
//! written with them by `fixtures/make_fixtures.py`).

use std::path::{Path, PathBuf};

use serde_json::Value;

fn lib() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/datasets_lib")
}

/// What `datasets` read back for `key`.
fn expected(key: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(lib().join("expected.json")).unwrap();
    let all: serde_json::Map<String, Value> = serde_json::from_str(&text).unwrap();
    all[key].as_array().unwrap().clone()
}

fn fields(rows: Vec<rl_data::Row>) -> Vec<Value> {
    rows.into_iter().map(|r| Value::Object(r.fields)).collect()
}

fn load(name: &str, splits: &[&str]) -> rl_data::Result<Vec<rl_data::Row>> {
    let splits: Vec<String> = splits.iter().map(|s| s.to_string()).collect();
    rl_data::load(&lib().join(name).to_string_lossy(), &[], &splits)
}

#[test]
fn a_saved_dataset_dict_reads_as_load_from_disk_reads_it() {
    // train is two shards, read in state.json's order.
    let train = load("dict", &["train"]).unwrap();
    assert_eq!(fields(train.clone()), expected("dict/train"));
    assert!(train[3].at.ends_with("data-00001-of-00002.arrow row 2"), "{}", train[3].at);
    assert_eq!(fields(load("dict", &["test"]).unwrap()), expected("dict/test"));
    assert_eq!(load("dict", &["train", "test"]).unwrap().len(), 5);
    let err = load("dict", &["validation"]).unwrap_err().to_string();
    assert!(err.contains("save_to_disk directory") && err.contains("no split `validation`"), "{err}");
    assert!(err.contains("names train, test") || err.contains("names test, train"), "{err}");
    let subsets = [String::from("main")];
    let err = rl_data::load(&lib().join("dict").to_string_lossy(), &subsets, &[String::from("train")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("no subsets"), "{err}");
}

#[test]
fn a_saved_dataset_is_one_split() {
    assert_eq!(fields(load("one", &["train"]).unwrap()), expected("one"));
    let err = load("one", &["test"]).unwrap_err().to_string();
    assert!(err.contains("is one split") && err.contains("no split `test`"), "{err}");
    // A shard on its own is a data file too.
    let shard = lib().join("one/data-00000-of-00001.arrow");
    assert_eq!(fields(rl_data::read_file(&shard).unwrap()), expected("one"));
}

#[test]
fn csv_and_tsv_are_typed_as_datasets_types_them() {
    for name in ["rows.csv", "rows.tsv"] {
        assert_eq!(fields(rl_data::read_file(&lib().join(name)).unwrap()), expected(name), "{name}");
    }
}
