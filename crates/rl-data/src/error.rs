//! What can go wrong reading a dataset, each naming the file, row or name it is about.

use std::path::PathBuf;

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or directory could not be read.
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// A line (JSONL) or file (JSON) is not valid JSON.
    #[error("{at}: not valid JSON: {message}")]
    Json { at: String, message: String },
    /// A row is not a JSON object.
    #[error("{at}: expected a JSON object (one row), got {got}")]
    NotAnObject { at: String, got: &'static str },
    /// A Parquet file could not be decoded.
    #[error("{path}: cannot read Parquet: {message}")]
    Parquet { path: PathBuf, message: String },
    /// An Arrow file could not be decoded.
    #[error("{path}: cannot read Arrow: {message}")]
    Arrow { path: PathBuf, message: String },
    /// A CSV line could not be read.
    #[error("{at}: cannot read CSV: {message}")]
    Csv { at: String, message: String },
    /// A `save_to_disk` directory that does not hold what was asked.
    #[error("{root} (a `datasets` save_to_disk directory): {message}")]
    Saved { root: PathBuf, message: String },
    /// A file of a kind this crate does not read.
    #[error(
        "{path}: not a data file this reads (expected .parquet, .arrow, .jsonl, .ndjson, .json, .csv or .tsv, the \
         text ones optionally .gz)"
    )]
    Unsupported { path: PathBuf },
    /// A data file without rows.
    #[error("{path} has no rows")]
    Empty { path: PathBuf },
    /// A dataset name that is neither a path nor in the local hub cache.
    #[error(
        "dataset `{name}` is not a file or directory, and not in the Hugging Face hub cache ({looked}); \
         nothing is downloaded at run time: fetch it first, e.g. `hf download {name} --repo-type dataset` \
         (into the cache) or `hf download {name} --repo-type dataset --local-dir data/{leaf}` and give that path"
    )]
    NotFound { name: String, looked: String, leaf: String },
    /// A cached dataset whose revision cannot be told.
    #[error("{repo}: {message}")]
    Snapshot { repo: PathBuf, message: String },
    /// A single data file asked for a split other than `train`, or for a subset.
    #[error(
        "{path} is one data file, its rows all `train`: it has no {asked} (give a dataset directory, or another file)"
    )]
    SplitOfFile { path: PathBuf, asked: String },
    /// No data file of a split (and subsets) in a dataset directory.
    #[error(
        "{root}: no data files for split `{split}`{subsets} (splits are read from file and folder names as the \
         `datasets` library reads them: `train`, `data/train-00000-of-00001.parquet`, `test/0000.parquet`, ...); \
         data files there: {found}"
    )]
    NoSplit { root: PathBuf, split: String, subsets: String, found: String },
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }
}

/// `read()`, with a panic inside it (a third-party decoder's assertion on a damaged file) turned
/// into the error `damaged` makes of the panic's message.
pub(crate) fn unpanicked<T>(
    read: impl FnOnce() -> Result<T> + std::panic::UnwindSafe,
    damaged: impl FnOnce(String) -> Error,
) -> Result<T> {
    std::panic::catch_unwind(read).unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| String::from("the decoder failed"));
        Err(damaged(message))
    })
}
