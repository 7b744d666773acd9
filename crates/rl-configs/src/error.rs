//! The error type of `rl-configs`: every variant names the key, the file it came from and what was expected.

use std::path::PathBuf;

/// Result alias for this crate.
pub type Result<T, E = ConfigError> = std::result::Result<T, E>;

/// Everything that can go wrong while loading, merging, translating or validating a config.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A config file could not be read.
    #[error("cannot read config file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// A config file is not valid TOML/JSON.
    #[error("cannot parse config file {}: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message (with line and column where the parser gives them).
        message: String,
    },
    /// A command-line argument is malformed.
    #[error("bad command-line argument `{arg}`: {message}")]
    Cli {
        /// The offending argument.
        arg: String,
        /// What is wrong and what was expected.
        message: String,
    },
    /// A key that the schema does not know.
    #[error("unknown key `{key}` (from {origin}){}", suggestion_text(suggestion.as_deref(), expected))]
    UnknownKey {
        /// Full dotted path of the key.
        key: String,
        /// Where it came from: a file path or `the command line`.
        origin: String,
        /// The closest known key, if any is close.
        suggestion: Option<String>,
        /// The keys allowed at that place.
        expected: Vec<String>,
    },
    /// A key of another variant of a tagged section than the one its tag (`type`, or an
    /// algorithm's `id`) chose.
    #[error("`{key}` (from {origin}) is a key of {variants}: set `{tag_key}`, or remove `{key}`")]
    OtherVariant {
        /// Full dotted path of the key.
        key: String,
        /// Where it came from.
        origin: String,
        /// The tag's full path (`data.type`).
        tag_key: String,
        /// The variants that have the key and the one chosen, in words.
        variants: String,
    },
    /// A key this schema once had and dropped.
    #[error("`{key}` (from {origin}) was removed: {why}; delete it")]
    Removed {
        /// Full dotted path of the key.
        key: String,
        /// Where it came from.
        origin: String,
        /// Why, and what to do instead.
        why: &'static str,
    },
    /// A value of the wrong type or shape.
    #[error("wrong value for `{key}` (from {origin}): {message}")]
    WrongType {
        /// Full dotted path of the key.
        key: String,
        /// Where it came from.
        origin: String,
        /// What was expected and what was found.
        message: String,
    },
    /// A deprecated key and its replacement are both set, to different values.
    #[error(
        "`{old}` is deprecated and `{new}` replaces it, but both are set to different values (from {origin}): keep only `{new}`"
    )]
    DeprecatedConflict {
        /// The deprecated key.
        old: String,
        /// The key that replaces it.
        new: String,
        /// Where they came from.
        origin: String,
    },
    /// A shared top-level key conflicts with the same setting in one part.
    #[error(
        "shared key `{shared}` = {shared_value} conflicts with `{target}` = {target_value}: set one of them, or make them equal"
    )]
    SharedConflict {
        /// The shared key.
        shared: String,
        /// The part's key.
        target: String,
        /// The shared value, as JSON.
        shared_value: String,
        /// The part's value, as JSON.
        target_value: String,
    },
    /// A validation rule failed.
    #[error("invalid config: `{key}`: {message}")]
    Invalid {
        /// Full dotted path of the key (or keys) the rule is about.
        key: String,
        /// The rule and the values that broke it.
        message: String,
    },
}

impl ConfigError {
    /// Shorthand for a failed validation rule.
    pub fn invalid(key: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError::Invalid { key: key.into(), message: message.into() }
    }
}

fn suggestion_text(suggestion: Option<&str>, expected: &[String]) -> String {
    match suggestion {
        Some(s) => format!(": did you mean `{s}`?"),
        None if expected.is_empty() => String::from(": nothing may be set here"),
        None => {
            format!(": expected one of {}", expected.iter().map(|e| format!("`{e}`")).collect::<Vec<_>>().join(", "))
        }
    }
}
