//! Integration tests of rl-configs: loading semantics, validation rules, the committed JSON Schema,
//! and parse(serialize(config)) == config.

mod loading;
mod roundtrip;
mod schema;
mod validation;

use std::path::PathBuf;

use rl_configs::{ConfigError, ConfigFile, Loaded, load};

/// A temp directory holding TOML files written by a test.
pub(crate) struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    pub(crate) fn new() -> Self {
        Files { dir: tempfile::tempdir().expect("temp dir") }
    }

    /// Writes `text` to `name` and returns its path as a string.
    pub(crate) fn write(&self, name: &str, text: &str) -> String {
        let path: PathBuf = self.dir.path().join(name);
        std::fs::write(&path, text).expect("write test file");
        path.display().to_string()
    }
}

/// Loads with whitespace-separated arguments (`@ path --key value`).
pub(crate) fn load_args<T: ConfigFile>(args: &[&str]) -> Result<Loaded<T>, ConfigError> {
    let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
    load::<T>(&args)
}

/// A minimal valid RL config file body.
pub(crate) const MINIMAL_RL: &str = r#"
max_steps = 5
[model]
path = "m/tiny"
[[orchestrator.train.env]]
id = "reverse-text"
"#;
