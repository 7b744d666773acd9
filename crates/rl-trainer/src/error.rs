//! The error type of `rl-trainer`.

use std::path::PathBuf;

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong training.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tensor operation failed.
    #[error("tensor error: {0}")]
    Candle(#[from] candle_core::Error),
    /// The model failed.
    #[error(transparent)]
    Model(#[from] rl_model::Error),
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A run file could not be written or read.
    #[error(transparent)]
    File(#[from] rl_run::FileError),
    /// A batch is malformed (which micro-batch, which field).
    #[error("bad batch {}: {message}", path.display())]
    BadBatch {
        /// The batch file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A micro-batch's samples and parents do not form a valid row.
    #[error("micro-batch layout: {0}")]
    Layout(String),
    /// A batch did not arrive in time.
    #[error("no batch for step {step} at {} after {waited_s:.0} s: is the orchestrator running?", path.display())]
    BatchTimeout {
        /// The step waited for.
        step: u64,
        /// The file waited for.
        path: PathBuf,
        /// Seconds waited.
        waited_s: f64,
    },
    /// A checkpoint is missing or inconsistent.
    #[error("checkpoint {}: {message}", path.display())]
    Checkpoint {
        /// The checkpoint directory.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The loss or the gradients are not finite.
    #[error("training diverged at step {step}: {what} is not finite")]
    NonFinite {
        /// The step.
        step: u64,
        /// Which quantity.
        what: String,
    },
    /// A configuration the trainer cannot run.
    #[error("{0}")]
    Unsupported(String),
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }
}
