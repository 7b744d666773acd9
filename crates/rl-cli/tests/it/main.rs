//! Integration tests of the `rl` binary: dry runs of every shipped config, deprecated keys,
//! errors and exit codes, schemas.

mod dry_run;
mod durability;
mod e2e;
mod env_server;
mod eval;
mod guide;
mod hub;
mod recipes;
mod run_lock;
mod sft;
mod supervision;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The workspace root.
pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `rl` from the workspace root.
pub(crate) fn rl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rl")).args(args).current_dir(root()).output().expect("run rl")
}

pub(crate) fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub(crate) fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}
