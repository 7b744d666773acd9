//! The error type of `rl-model`.

use std::path::PathBuf;

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong loading, running or saving a model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tensor operation failed.
    #[error("tensor error: {0}")]
    Candle(#[from] candle_core::Error),
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file could not be written durably.
    #[error(transparent)]
    File(#[from] rl_run::FileError),
    /// A model directory is incomplete or inconsistent.
    #[error("model directory {}: {message}", dir.display())]
    BadModelDir {
        /// The directory.
        dir: PathBuf,
        /// What is missing or wrong.
        message: String,
    },
    /// The tokenizer failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template failed to render.
    #[error("chat template: {0}")]
    Template(String),
    /// An input is out of range (too long, unknown token id, ...).
    #[error("invalid input: {0}")]
    Input(String),
    /// The configured device cannot be used.
    #[error("{0}")]
    Device(String),
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }

    pub(crate) fn bad_dir(dir: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Error::BadModelDir { dir: dir.into(), message: message.into() }
    }
}
