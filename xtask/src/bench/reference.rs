//! The benchmarks' shared pieces: the reference interpreter (a venv from PyPI with the pinned
//! reference packages), JSON result lines of a command, and printing as results arrive.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, bail};
use serde_json::Value;

use crate::venv::Venv;

/// The reference packages, pinned to the versions the figures of docs/benchmarks.md were measured with.
pub(crate) const REFERENCE_PACKAGES: &[&str] =
    &["torch==2.15.*", "transformers==5.23.*", "trl==1.16.*", "peft==0.21.*", "datasets"];

/// The reference interpreter: `RL_BENCH_PYTHON`, or `target/bench-venv` (created and filled from
/// PyPI the first time).
pub(crate) fn reference_python() -> anyhow::Result<PathBuf> {
    match std::env::var_os("RL_BENCH_PYTHON") {
        Some(p) => Ok(PathBuf::from(p)),
        None => bench_venv().ensure(),
    }
}

/// The venv `reference_python` makes, unless `RL_BENCH_PYTHON` names another interpreter.
pub(crate) fn reference_venv() -> Option<Venv> {
    std::env::var_os("RL_BENCH_PYTHON").is_none().then(bench_venv)
}

fn bench_venv() -> Venv {
    Venv {
        dir: crate::workspace::project_root().join("target/bench-venv"),
        packages: REFERENCE_PACKAGES.iter().map(|p| String::from(*p)).collect(),
        purpose: "the benchmark references",
    }
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
