//! The benchmarks' shared pieces: the reference interpreter (a venv from PyPI with the pinned
//! reference packages), JSON result lines of a command, and printing as results arrive.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, bail};
use serde_json::Value;

/// The reference packages, pinned to the versions the figures of docs/benchmarks.md were measured with.
pub(crate) const REFERENCE_PACKAGES: &[&str] =
    &["torch==2.15.*", "transformers==5.23.*", "trl==1.16.*", "peft==0.21.*", "datasets"];

/// The reference interpreter: `RL_BENCH_PYTHON`, or `target/bench-venv` (created and filled from
/// PyPI the first time).
pub(crate) fn reference_python() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("RL_BENCH_PYTHON") {
        return Ok(PathBuf::from(p));
    }
    crate::venv::ensure(
        &crate::workspace::project_root().join("target/bench-venv"),
        REFERENCE_PACKAGES,
        "the benchmark references",
    )
}

/// JSON lines of a command's stdout.
pub(crate) fn json_lines(cmd: &mut Command, what: &str) -> anyhow::Result<Vec<Value>> {
    let out = cmd.output().with_context(|| format!("cannot run {what}"))?;
    if !out.status.success() {
        bail!("{what} failed ({}):\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| serde_json::from_str(l).ok()).collect())
}

pub(crate) fn print_out(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}
