//! The Python environment SDK (`python/rl-env`): installed with pip into a venv made from PyPI
//! (which checks that it installs), linted and type-checked there (ruff, mypy --strict, pinned in
//! its `dev` extra), then its unit and protocol tests run there.

use anyhow::{Context, bail};

use crate::venv::Venv;

/// Where the SDK lives in the repository.
const SDK: &str = "python/rl-env";

/// `target/sdk-venv`: the SDK (editable) with the W&B extra (the tracking sidecar's test writes an
/// offline run) and the linters.
pub(crate) fn venv() -> Venv {
    let root = crate::workspace::project_root();
    let spec = format!("--editable={}[wandb,dev]", root.join(SDK).display());
    Venv { dir: root.join("target/sdk-venv"), packages: vec![spec], purpose: "the rl-env Python SDK" }
}

/// Installs the SDK (editable) into `target/sdk-venv`, lints and type-checks it, and runs its tests.
pub(crate) fn test() -> anyhow::Result<()> {
    let sdk = crate::workspace::project_root().join(SDK);
    let python = venv().ensure()?;
    let code = ["src", "tests", "tests_verifiers", "examples"];
    let checks: [(&str, Vec<&str>); 3] = [
        ("ruff check", [&["-m", "ruff", "check"][..], &code].concat()),
        ("ruff format --check", [&["-m", "ruff", "format", "--check"][..], &code].concat()),
        // Files and strictness come from pyproject.toml.
        ("mypy", vec!["-m", "mypy"]),
    ];
    for (what, args) in checks {
        let status = crate::venv::command(&python)
            .args(&args)
            .current_dir(&sdk)
            .env_remove("PYTHONPATH")
            .status()
            .with_context(|| format!("cannot run {what} on the SDK"))?;
        if !status.success() {
            bail!("{what} found problems in {SDK} ({status})");
        }
    }
    let status = crate::venv::command(&python)
        .args(["-m", "unittest", "discover", "--start-directory"])
        .arg(sdk.join("tests"))
        .arg("--top-level-directory")
        .arg(sdk.join("tests"))
        .env_remove("PYTHONPATH")
        .status()
        .context("cannot run the SDK's tests")?;
    if !status.success() {
        bail!("the rl-env SDK's tests failed ({status})");
    }
    Ok(())
}
