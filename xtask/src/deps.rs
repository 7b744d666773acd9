//! Dependency-direction rules, checked with `cargo tree` on the normal (non-dev) dependency graph.

use std::process::Command;

use anyhow::{Context, bail};

/// (crate, crates it must never depend on). Crates not in the workspace yet are skipped.
const RULES: &[(&str, &[&str])] = &[
    // The bottom layer: the run directory contract, below the config schema.
    ("rl-run", &["rl-configs", "tokio", "tonic", "prost", "candle-core", "axum", "reqwest", "hyper", "toml", "schemars"]),
    ("rl-configs", &["tokio", "tonic", "prost", "candle-core", "candle-nn", "axum", "reqwest", "hyper", "tokenizers"]),
    // tonic's `router` feature (needed by `Server::add_service`) brings axum in, so axum is allowed.
    ("rl-proto", &["candle-core", "reqwest", "tokenizers"]),
    // candle-core itself depends on tokenizers (for GGUF), so that one cannot be ruled out here.
    ("rl-kernels", &["tokio", "tonic", "axum", "reqwest", "candle-nn", "rl-configs", "rl-run"]),
    ("rl-model", &["tokio", "tonic", "axum", "reqwest"]),
    ("rl-serve", &["candle-core"]),
    ("rl-envs", &["candle-core"]),
    ("rl-orchestrator", &["candle-core", "candle-nn"]),
    ("rl-trainer", &["tonic", "axum"]),
    ("rl-inference", &["tonic", "rl-orchestrator", "rl-trainer"]),
];

/// Fails when a crate depends, directly or not, on a crate its rule forbids.
pub(crate) fn check() -> anyhow::Result<()> {
    let mut problems = Vec::new();
    for (krate, forbidden) in RULES {
        if !crate::workspace::project_root().join("crates").join(krate).exists() {
            continue;
        }
        let out = Command::new("cargo")
            .args(["tree", "-p", krate, "-e", "normal", "--prefix", "none", "--locked"])
            .output()
            .with_context(|| format!("cannot run cargo tree for {krate}"))?;
        if !out.status.success() {
            bail!("cargo tree -p {krate} failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let tree = String::from_utf8_lossy(&out.stdout);
        for line in tree.lines() {
            let name = line.split_whitespace().next().unwrap_or("");
            if forbidden.contains(&name) {
                problems.push(format!("{krate} depends on {name}"));
            }
        }
    }
    problems.sort();
    problems.dedup();
    if !problems.is_empty() {
        bail!("dependency rules broken:\n  {}", problems.join("\n  "));
    }
    Ok(())
}
