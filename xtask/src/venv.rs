//! Python virtual environments that xtask makes from PyPI on demand (benchmark references, the
//! CUDA toolchain wheels), each remembered by a marker listing what was installed.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// The interpreter of the venv at `dir` holding `packages` (pip requirement strings), made and
/// filled the first time or whenever the list changes. `purpose` names it in messages.
pub(crate) fn ensure(dir: &Path, packages: &[&str], purpose: &str) -> anyhow::Result<PathBuf> {
    let python = dir.join("bin/python");
    let marker = dir.join(".installed");
    let wanted = packages.join("\n");
    if std::fs::read_to_string(&marker).is_ok_and(|have| have == wanted) {
        return Ok(python);
    }
    crate::workspace::eprintln_flush(&format!(
        "xtask: installing {purpose} into {} from PyPI: {}",
        dir.display(),
        packages.join(" ")
    ));
    if !python.exists() {
        let status =
            Command::new("python3").arg("-m").arg("venv").arg(dir).status().context("cannot run python3 -m venv")?;
        if !status.success() {
            bail!("python3 -m venv {} failed ({status})", dir.display());
        }
    }
    let status = Command::new(&python)
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
        .args(packages)
        .status()
        .context("cannot run pip")?;
    if !status.success() {
        bail!("pip install {} failed ({status}): {purpose} comes from PyPI, is it reachable?", packages.join(" "));
    }
    std::fs::write(&marker, wanted).with_context(|| format!("cannot write {}", marker.display()))?;
    Ok(python)
}
