//! The example env crate outside the workspace (`examples/rust-env`): fmt, clippy and its own tests, then `rl rl`
//! trains on it for two steps, the launcher starting its binary through the env's `command`.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

const MANIFEST: &str = "examples/rust-env/Cargo.toml";

/// Tests the example crate and trains on its env for two steps.
pub(crate) fn check() -> anyhow::Result<()> {
    let root = crate::workspace::project_root();
    let target = root.join("target");
    crate::workspace::cargo(&["fmt", "--manifest-path", MANIFEST, "--", "--check"])?;
    // Its own workspace resolves its own features and profile, so its dependencies share no
    // artifacts with ours: compiled once here, not once checked for clippy and once built for the
    // tests. Clippy's driver compiles the crate itself (as `cargo clippy` does, for workspace
    // members only), the tests then run from that build, and `rl rl`'s `cargo run` reuses it
    // under the same environment. `-D warnings` reaches only local crates: cargo caps the lints
    // of registry dependencies.
    let driver = clippy_driver()?;
    let env = [
        ("CARGO_TARGET_DIR", target.as_os_str()),
        ("RUSTC_WORKSPACE_WRAPPER", driver.as_os_str()),
        ("RUSTFLAGS", OsStr::new("-D warnings")),
    ];
    crate::workspace::cargo_env(&["test", "--locked", "--all-targets", "--manifest-path", MANIFEST], &env)?;
    crate::workspace::build_rl_as_tested()?;
    let rl = target.join("debug/rl");
    let out = target.join("example-env");
    let model = out.join("tiny");
    run(Command::new(&rl).args(["model", "init", "--force", "--out"]).arg(&model), "rl model init")?;
    run(
        Command::new(&rl)
            .args(["rl", "@", "examples/rust-env/rl.toml", "--clean", "--max-steps", "2", "--model.path"])
            .arg(&model)
            .arg("--output-dir")
            .arg(&out)
            .envs(env),
        "rl rl @ examples/rust-env/rl.toml",
    )?;
    let metrics = out.join("word-count/metrics.jsonl");
    let rows = std::fs::read_to_string(&metrics).with_context(|| format!("cannot read {}", metrics.display()))?;
    if rows.lines().count() != 2 {
        bail!("{} has {} rows, expected one per step (2)", metrics.display(), rows.lines().count());
    }
    Ok(())
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

fn run(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    let status =
        cmd.current_dir(crate::workspace::project_root()).status().with_context(|| format!("cannot run {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status}); logs under {}", Path::new("target/example-env").display());
    }
    Ok(())
}
