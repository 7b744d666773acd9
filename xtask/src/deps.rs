//! Dependency-direction rules, checked with `cargo tree` on the normal (non-dev) dependency graph.

use std::process::Command;

use anyhow::{Context, bail};

/// (crate, crates it must never depend on). Crates not in the workspace yet are skipped.
const RULES: &[(&str, &[&str])] = &[
    // The bottom layer: the run directory contract, below the config schema.
    (
        "rl-run",
        &["rl-configs", "tokio", "tonic", "prost", "candle-core", "axum", "reqwest", "hyper", "toml", "schemars"],
    ),
    // Dataset files: a reader, not a server, a model or a config.
    ("rl-data", &["rl-configs", "tokio", "tonic", "prost", "candle-core", "axum", "reqwest", "hyper", "tokenizers"]),
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

/// The workspace's crates in layers, bottom first: a crate may depend (normal dependencies) only
/// on crates of lower layers. ARCHITECTURE.md draws this table (a test keeps the drawing true).
const LAYERS: &[&[&str]] = &[
    &["rl-run"],
    &["rl-proto", "rl-configs", "rl-kernels", "rl-data"],
    &["rl-serve", "rl-model"],
    &["rl-orchestrator", "rl-envs", "rl-trainer", "rl-inference"],
    &["rl-cli"],
];

fn layer_of(krate: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&krate))
}

/// The layer table as ARCHITECTURE.md draws it, top layer first.
#[cfg(test)]
fn layers_drawing() -> String {
    LAYERS.iter().enumerate().rev().map(|(i, layer)| format!("layer {i}   {}\n", layer.join("   "))).collect()
}

/// Every workspace crate is in a layer and depends only on crates of lower layers.
fn check_layers(problems: &mut Vec<String>) -> anyhow::Result<()> {
    let out = Command::new("cargo")
        .args(["metadata", "--format-version", "1", "--no-deps", "--locked"])
        .output()
        .context("cannot run cargo metadata")?;
    if !out.status.success() {
        bail!("cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).context("cargo metadata output")?;
    for package in meta["packages"].as_array().into_iter().flatten() {
        let name = package["name"].as_str().unwrap_or_default();
        if !name.starts_with("rl-") {
            continue;
        }
        let Some(own) = layer_of(name) else {
            problems.push(format!("{name} is in no layer of xtask/src/deps.rs LAYERS"));
            continue;
        };
        for dep in package["dependencies"].as_array().into_iter().flatten() {
            let dep_name = dep["name"].as_str().unwrap_or_default();
            let normal = dep["kind"].is_null();
            if let (true, Some(theirs)) = (normal, layer_of(dep_name))
                && theirs >= own
            {
                problems
                    .push(format!("{name} (layer {own}) depends on {dep_name} (layer {theirs}): only lower layers"));
            }
        }
    }
    Ok(())
}

/// Fails when a crate depends, directly or not, on a crate its rule forbids, or on a crate of its
/// own or a higher layer.
pub(crate) fn check() -> anyhow::Result<()> {
    let mut problems = Vec::new();
    check_layers(&mut problems)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn architecture_md_draws_the_layers() {
        let doc = std::fs::read_to_string(crate::workspace::project_root().join("ARCHITECTURE.md")).unwrap();
        let drawing = layers_drawing();
        assert!(doc.contains(&drawing), "ARCHITECTURE.md must hold the layer table as drawn here:\n{drawing}");
    }

    #[test]
    fn every_crate_dir_is_in_one_layer() {
        let crates = std::fs::read_dir(crate::workspace::project_root().join("crates")).unwrap();
        for entry in crates.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let count = LAYERS.iter().filter(|l| l.contains(&name.as_str())).count();
            assert_eq!(count, 1, "{name} must be in exactly one layer");
        }
    }
}
