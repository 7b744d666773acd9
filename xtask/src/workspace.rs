//! Where the workspace is and how to run cargo in it: what every xtask command shares.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// Runs cargo with `args`, failing on a non-zero exit.
pub(crate) fn cargo(args: &[&str]) -> anyhow::Result<()> {
    cargo_env(args, &[])
}

/// Runs cargo with `args` and extra environment variables, failing on a non-zero exit.
pub(crate) fn cargo_env(args: &[&str], env: &[(&str, &OsStr)]) -> anyhow::Result<()> {
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| String::from("cargo")))
        .args(args)
        .envs(env.iter().copied())
        .status()
        .with_context(|| format!("cannot run cargo {}", args.join(" ")))?;
    if !status.success() {
        bail!("`cargo {}` failed ({status})", args.join(" "));
    }
    Ok(())
}

/// Builds `target/debug/rl` as the tests step builds it, so after that step this is a no-op: the
/// test build resolves features over the whole workspace and its dev-dependencies, and
/// `cargo build -p rl-cli` (its own feature set) would compile much of the graph again (3.5 min
/// on a clean 2-core machine).
pub(crate) fn build_rl_as_tested() -> anyhow::Result<()> {
    cargo(&["test", "--workspace", "--locked", "--no-run"])
}

/// The workspace root (the parent of this crate's directory).
pub(crate) fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace root").to_path_buf()
}

/// Prints a line to stderr at once (progress between long steps).
pub(crate) fn eprintln_flush(line: &str) {
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{line}");
}
