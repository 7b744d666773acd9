//! The example env crate outside the workspace (`examples/rust-env`): fmt, clippy and its own tests, then `rl rl`
//! trains on it for two steps, the launcher starting its binary through the env's `command`.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail};

const MANIFEST: &str = "examples/rust-env/Cargo.toml";

/// Tests the example crate and trains on its env for two steps.
pub(crate) fn check() -> anyhow::Result<()> {
    let root = crate::workspace::project_root();
    let target = root.join("target");
    crate::workspace::cargo(&["fmt", "--manifest-path", MANIFEST, "--", "--check"])?;
    // Its own workspace resolves its own features and profile, so its dependencies share no
    // artifacts with ours: compiled once here, linted as it compiles (`linted_build_env`), not
    // once checked for clippy and once built for the tests; `rl rl`'s `cargo run` reuses that
    // build under the same environment.
    let mut owned = crate::workspace::linted_build_env()?;
    owned.push(("CARGO_TARGET_DIR", target.clone().into_os_string()));
    // Its dependencies build at its own profile's opt-level 0 with full debug info, which nothing
    // here reads: without it, 150 -> 122 s on 2 cores.
    owned.push(("CARGO_PROFILE_DEV_DEBUG", "false".into()));
    let env = crate::workspace::as_env(&owned);
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
            .envs(env.iter().copied()),
        "rl rl @ examples/rust-env/rl.toml",
    )?;
    let metrics = out.join("word-count/metrics.jsonl");
    let rows = std::fs::read_to_string(&metrics).with_context(|| format!("cannot read {}", metrics.display()))?;
    if rows.lines().count() != 2 {
        bail!("{} has {} rows, expected one per step (2)", metrics.display(), rows.lines().count());
    }
    Ok(())
}

fn run(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    let status =
        cmd.current_dir(crate::workspace::project_root()).status().with_context(|| format!("cannot run {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status}); logs under {}", Path::new("target/example-env").display());
    }
    Ok(())
}
