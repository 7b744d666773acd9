//! The error type of `rl-orchestrator`.

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong orchestrating.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An algorithm produced values of the wrong length for a branch.
    #[error(
        "algorithm `{algorithm}`: trace {trace} branch {branch} has {tokens} tokens but got {values} values and {mask} mask entries"
    )]
    Dimensions {
        /// The algorithm.
        algorithm: String,
        /// Trace index in the group.
        trace: usize,
        /// Branch index in the trace.
        branch: usize,
        /// Tokens in the branch.
        tokens: usize,
        /// Values produced.
        values: usize,
        /// Mask entries produced.
        mask: usize,
    },
    /// An algorithm produced NaN or infinite values.
    #[error("algorithm `{algorithm}`: trace {trace} branch {branch} has non-finite values")]
    NonFinite {
        /// The algorithm.
        algorithm: String,
        /// Trace index in the group.
        trace: usize,
        /// Branch index in the trace.
        branch: usize,
    },
    /// A scoring model call failed or answered something unusable.
    #[error("scoring model `{model}` ({url}): {message}")]
    Scoring {
        /// The model key.
        model: String,
        /// The URL called.
        url: String,
        /// What happened.
        message: String,
    },
    /// A checkpoint is missing, incomplete or does not match the run.
    #[error("orchestrator checkpoint {path}: {message}")]
    Checkpoint {
        /// The checkpoint file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// An env-server call failed.
    #[error(transparent)]
    Env(#[from] rl_serve::Error),
    /// Rollouts failed in a way retrying cannot fix.
    #[error("env `{env}`: rollout failed and will not be retried: {message}")]
    Rollout {
        /// The env.
        env: String,
        /// The error.
        message: String,
    },
    /// The model endpoint failed.
    #[error("policy endpoint {url}: {message}")]
    Policy {
        /// The URL called.
        url: String,
        /// What happened.
        message: String,
    },
    /// A file could not be written or read.
    #[error("{path}: {message}")]
    Io {
        /// The file.
        path: String,
        /// What happened.
        message: String,
    },
    /// A run file could not be written or read.
    #[error(transparent)]
    File(#[from] rl_run::FileError),
    /// A configuration the orchestrator cannot run.
    #[error("{0}")]
    Config(String),
}

impl Error {
    pub(crate) fn io(path: &std::path::Path, e: &std::io::Error) -> Self {
        Error::Io { path: path.display().to_string(), message: e.to_string() }
    }
}
