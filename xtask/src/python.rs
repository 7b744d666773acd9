//! The Python environment SDK (`python/rl-env`): installed with pip into a venv made from PyPI
//! (which checks that it installs), then its unit and protocol tests run there.

use std::process::Command;

use anyhow::{Context, bail};

/// Where the SDK lives in the repository.
const SDK: &str = "python/rl-env";

/// Installs the SDK (editable) into `target/sdk-venv` and runs its tests.
pub(crate) fn test() -> anyhow::Result<()> {
    let root = crate::workspace::project_root();
    let sdk = root.join(SDK);
    // With the W&B extra: the tracking sidecar's test writes an offline run.
    let spec = format!("--editable={}[wandb]", sdk.display());
    let python = crate::venv::ensure(&root.join("target/sdk-venv"), &[spec.as_str()], "the rl-env Python SDK")?;
    let status = Command::new(&python)
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
