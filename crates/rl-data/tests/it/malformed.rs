//! Damaged data files (truncated, bytes overwritten, CSV text of any shape) are errors that name
//! the file, never a panic: users' datasets come from interrupted downloads and hand edits.

use std::path::{Path, PathBuf};

use proptest::prelude::*;

/// Every binary fixture: Parquet (several codecs, nested columns) and `datasets`' Arrow shards.
fn binaries() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut files = vec![
        root.join("fixtures/data/train-00000-of-00001.parquet"),
        root.join("fixtures/zstd.parquet"),
        root.join("fixtures/lz4.parquet"),
        root.join("fixtures/gzip.parquet"),
        root.join("datasets_lib/one/data-00000-of-00001.arrow"),
        root.join("datasets_lib/dict/train/data-00000-of-00002.arrow"),
    ];
    files.retain(|f| f.exists());
    assert_eq!(files.len(), 6, "a fixture is missing");
    files
}

/// Reads `bytes` as a file named like `like`; Ok or an error naming the file, not a panic.
fn read_as(like: &Path, bytes: &[u8]) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().map_err(|e| TestCaseError::fail(e.to_string()))?;
    read_at(&dir.path().join(like.file_name().unwrap()), bytes)
}

/// Writes `bytes` to `path` and reads it back: Ok, or an error that names `path`.
fn read_at(path: &Path, bytes: &[u8]) -> Result<(), TestCaseError> {
    std::fs::write(path, bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
    match std::panic::catch_unwind(|| rl_data::read_file(path)) {
        Err(_) => Err(TestCaseError::fail(format!("{} ({} bytes) panicked", path.display(), bytes.len()))),
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => {
            let message = e.to_string();
            prop_assert!(message.contains(&path.display().to_string()), "the error does not name the file: {message}");
            Ok(())
        }
    }
}

#[test]
fn every_truncation_of_a_binary_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    for file in binaries() {
        let bytes = std::fs::read(&file).unwrap();
        let path = dir.path().join(file.file_name().unwrap());
        for len in 0..bytes.len() {
            read_at(&path, &bytes[..len]).unwrap();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn overwritten_bytes_of_a_binary_file_are_an_error(
        which in 0usize..6,
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
    ) {
        let files = binaries();
        let file = &files[which % files.len()];
        let mut bytes = std::fs::read(file).unwrap();
        for (at, value) in edits {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        read_as(file, &bytes)?;
    }

    #[test]
    fn any_csv_text_reads_or_is_an_error(text in "[a-c0-9,\"\t\n\r .-]{0,200}") {
        read_as(Path::new("x.csv"), text.as_bytes())?;
        read_as(Path::new("x.tsv"), text.as_bytes())?;
    }

    #[test]
    fn csv_text_cells_read_back_as_written(
        rows in prop::collection::vec(prop::collection::vec("x[a-z ,\"\n\r\t;]{0,12}", 3), 1..8),
    ) {
        // Cells that start with a letter are text whatever else they hold (quotes, delimiters,
        // line breaks): they must come back exactly as the csv writer wrote them.
        let mut writer = csv::Writer::from_writer(Vec::new());
        writer.write_record(["a", "b", "c"]).unwrap();
        for row in &rows {
            writer.write_record(row).unwrap();
        }
        let bytes = writer.into_inner().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.csv");
        std::fs::write(&path, &bytes).unwrap();
        let got = rl_data::read_file(&path).unwrap();
        prop_assert_eq!(got.len(), rows.len());
        for (row, want) in got.iter().zip(&rows) {
            for (name, cell) in ["a", "b", "c"].iter().zip(want) {
                prop_assert_eq!(row.fields[*name].as_str(), Some(cell.as_str()));
            }
        }
    }
}
