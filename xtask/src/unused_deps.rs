//! Declared-but-unused dependencies: every `[dependencies]` entry of a workspace crate must be
//! named in its Rust sources (`name::`, `use name`), dev-dependencies in its tests, benches or
//! `#[cfg(test)]` code, build-dependencies in `build.rs`. Reads `cargo metadata`; no extra tool.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use serde_json::Value;

/// Dependencies a crate needs without naming them in code, with the reason.
const USED_WITHOUT_NAMING: &[(&str, &str, &str)] =
    &[("rl-proto", "tonic-prost", "the generated gRPC code (included from OUT_DIR) names it")];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() && p.file_name().is_some_and(|n| n != "target") {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Whether `text` names crate `ident` as a path root (`ident::`, `use ident`, `extern crate ident`).
fn names(text: &str, ident: &str) -> bool {
    let boundary = |s: &str| s.chars().next_back().is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == ':'));
    text.match_indices(ident).any(|(at, _)| {
        let (before, after) = (&text[..at], &text[at + ident.len()..]);
        boundary(before)
            && (after.starts_with("::")
                || after.starts_with(';') && (before.ends_with("use ") || before.ends_with("extern crate "))
                || after.starts_with(" as ") && before.ends_with("use "))
    })
}

/// Fails listing every unused dependency.
pub(crate) fn check() -> anyhow::Result<()> {
    let out = Command::new("cargo")
        .args(["metadata", "--format-version", "1", "--no-deps", "--locked"])
        .output()
        .context("cannot run cargo metadata")?;
    if !out.status.success() {
        bail!("cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let meta: Value = serde_json::from_slice(&out.stdout).context("cargo metadata printed invalid JSON")?;
    let mut problems = Vec::new();
    for pkg in meta["packages"].as_array().into_iter().flatten() {
        let name = pkg["name"].as_str().unwrap_or_default();
        let dir = Path::new(pkg["manifest_path"].as_str().unwrap_or_default()).parent().unwrap_or(Path::new("."));
        let read = |sub: &[&str]| -> String {
            let mut files = Vec::new();
            for s in sub {
                let p = dir.join(s);
                if p.is_file() { files.push(p) } else { rust_files(&p, &mut files) }
            }
            files.iter().filter_map(|f| std::fs::read_to_string(f).ok()).collect::<Vec<_>>().join("\n")
        };
        let (code, test_code, build) =
            (read(&["src"]), read(&["src", "tests", "benches", "examples"]), read(&["build.rs"]));
        for dep in pkg["dependencies"].as_array().into_iter().flatten() {
            let dep_name = dep["name"].as_str().unwrap_or_default();
            let ident = dep["rename"].as_str().unwrap_or(dep_name).replace('-', "_");
            let (text, kind) = match dep["kind"].as_str() {
                Some("dev") => (&test_code, "dev-dependency"),
                Some("build") => (&build, "build-dependency"),
                _ => (&code, "dependency"),
            };
            let excused = USED_WITHOUT_NAMING.iter().any(|(k, d, _)| *k == name && *d == dep_name);
            if !excused && !names(text, &ident) {
                problems.push(format!("{name}: {kind} `{dep_name}` is never used"));
            }
        }
    }
    if !problems.is_empty() {
        bail!("declared but unused (remove them from Cargo.toml):\n  {}", problems.join("\n  "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::names;

    #[test]
    fn a_crate_is_named_only_as_a_path_root() {
        assert!(names("use serde::Deserialize;", "serde"));
        assert!(names("#[derive(thiserror::Error)]", "thiserror"));
        assert!(names("let x = rl_configs::RunDir::new(p);", "rl_configs"));
        assert!(names("use anyhow;", "anyhow"));
        assert!(!names("use my_serde::X;", "serde"), "a longer name is another crate");
        assert!(!names("// serde is nice", "serde"));
        assert!(!names("crate::serde::x", "serde"), "a module path is not the crate");
    }
}
