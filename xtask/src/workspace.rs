//! Where the workspace is and how to run cargo in it: what every xtask command shares.

use std::ffi::{OsStr, OsString};
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
    let env = linted_build_env()?;
    cargo_env(&["test", "--workspace", "--locked", "--no-run"], &as_env(&env))
}

/// The environment under which a build also lints: clippy's driver compiles the workspace's own
/// crates (what `cargo clippy` does; dependencies keep plain rustc, so their artifacts are the
/// ones a plain build makes) with warnings denied, passed as `cargo clippy -- -D warnings` passes
/// them. One build then both lints and makes the binaries, instead of a check of every crate and
/// then a build of every crate (on a clean machine the check alone took ~4 of CI's minutes).
/// The driver's artifacts carry their own hashes, so a plain `cargo test` afterwards neither
/// reuses nor overwrites them.
pub(crate) fn linted_build_env() -> anyhow::Result<Vec<(&'static str, OsString)>> {
    Ok(vec![
        ("RUSTC_WORKSPACE_WRAPPER", clippy_driver()?.into_os_string()),
        ("CLIPPY_ARGS", OsString::from("-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__")),
    ])
}

/// Borrows an owned environment list in the form `cargo_env` and `Command::envs` take.
pub(crate) fn as_env<'a>(env: &'a [(&'static str, OsString)]) -> Vec<(&'static str, &'a OsStr)> {
    env.iter().map(|(k, v)| (*k, v.as_os_str())).collect()
}

/// The toolchain's clippy driver, beside its rustc.
fn clippy_driver() -> anyhow::Result<PathBuf> {
    let out =
        Command::new("rustc").args(["--print", "sysroot"]).output().context("cannot run rustc --print sysroot")?;
    if !out.status.success() {
        bail!("rustc --print sysroot failed ({})", out.status);
    }
    let driver = Path::new(String::from_utf8_lossy(&out.stdout).trim()).join("bin/clippy-driver");
    if !driver.exists() {
        bail!("{} is missing: install clippy (`rustup component add clippy`)", driver.display());
    }
    Ok(driver)
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
