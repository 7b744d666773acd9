//! Tidy rules checked on the source tree: every `.rs` file opens with a `//!` doc line, no source
//! file is long without saying why, no circle between the files of a crate, and member manifests
//! take every dependency version and the lints from the workspace.

use std::path::{Path, PathBuf};

use anyhow::bail;

use crate::module_graph;

/// The files allowed to hold `unsafe` code: a checked call into the `gemm` crate, the
/// process-wide settings made while single-threaded (environment, `mallopt`), the global
/// allocator that keeps large freed blocks (`GlobalAlloc` is an `unsafe` trait), the cache
/// prefetch hint of the packed decode products, and the launches of our CUDA kernels.
const UNSAFE_ALLOWED: [&str; 5] = [
    "crates/rl-kernels/src/gemm.rs",
    "crates/rl-kernels/src/process.rs",
    "crates/rl-kernels/src/alloc.rs",
    "crates/rl-kernels/src/cpu/prefetch.rs",
    "crates/rl-kernels/src/ops/softmax_rows/cuda.rs",
];

/// Whether `text` uses or allows `unsafe` code (patterns built at run time so this file does not
/// match itself).
fn uses_unsafe(text: &str) -> bool {
    let kw = ["un", "safe"].concat();
    [format!("{kw} {{"), format!("{kw} fn"), format!("{kw} impl"), format!("allow({kw}_code)")]
        .iter()
        .any(|p| text.contains(p.as_str()))
}

/// Checks the whole tree under `root`; lists every violation.
pub(crate) fn check(root: &Path) -> anyhow::Result<()> {
    let mut problems = Vec::new();
    for file in files(root, "rs") {
        let text = std::fs::read_to_string(&file)?;
        if uses_unsafe(&text) && !UNSAFE_ALLOWED.contains(&rel(root, &file).as_str()) {
            problems.push(format!(
                "{}: `unsafe` code is allowed only in {}",
                rel(root, &file),
                UNSAFE_ALLOWED.join(", ")
            ));
        }
        if !text.lines().find(|l| !l.trim().is_empty()).is_some_and(|l| l.starts_with("//!")) {
            problems.push(format!("{}: must open with a `//!` line saying what the file is for", rel(root, &file)));
        }
    }
    problems.extend(layering_problems(root)?);
    // Workspace members only: `examples/` holds crates with workspaces of their own (a user's
    // crate cannot inherit this workspace's versions or lints).
    let member = |p: &PathBuf| {
        p.ends_with("Cargo.toml") && p != &root.join("Cargo.toml") && !p.starts_with(root.join("examples"))
    };
    for manifest in files(root, "toml").into_iter().filter(member) {
        let text = std::fs::read_to_string(&manifest)?;
        problems.extend(manifest_problems(&text).into_iter().map(|p| format!("{}: {p}", rel(root, &manifest))));
    }
    if !problems.is_empty() {
        bail!("tidy found {} problem(s):\n  {}", problems.len(), problems.join("\n  "));
    }
    Ok(())
}

/// Long files without a reason, and circles between the files of each crate's `src/`.
fn layering_problems(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut problems = Vec::new();
    let mut src_dirs: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))?
        .flatten()
        .map(|e| e.path().join("src"))
        .filter(|p| p.is_dir())
        .collect();
    src_dirs.push(root.join("xtask/src"));
    src_dirs.sort();
    for src in src_dirs {
        let mut modules = std::collections::BTreeMap::new();
        for file in files(&src, "rs") {
            let text = std::fs::read_to_string(&file)?;
            let lines = module_graph::non_test(&text).lines().count();
            let header: String = text.lines().take_while(|l| l.starts_with("//!")).collect();
            if lines > module_graph::MAX_LINES && !header.to_lowercase().contains("long because") {
                problems.push(format!(
                    "{}: {lines} lines before its tests (more than {}): split it, or say why in its `//!` header (\"long because ...\")",
                    rel(root, &file),
                    module_graph::MAX_LINES
                ));
            }
            if let Some(module) = file.strip_prefix(&src).ok().and_then(module_graph::module_of) {
                modules.insert(module, text);
            }
        }
        let graph = module_graph::edges(&modules);
        let name = |m: &str| if m.is_empty() { String::from("(root)") } else { m.to_owned() };
        for circle in module_graph::circles(&graph) {
            let crate_dir = rel(root, src.parent().unwrap_or(&src));
            let arrows: Vec<String> = circle
                .iter()
                .flat_map(|a| {
                    graph[a].iter().filter(|b| circle.contains(b)).map(move |b| format!("{} -> {}", name(a), name(b)))
                })
                .collect();
            problems.push(format!("{crate_dir}: files that name each other in a circle: {}", arrows.join(", ")));
        }
    }
    Ok(problems)
}

/// Problems of one member manifest: versions pinned outside the root, lints not inherited.
fn manifest_problems(text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let mut section = String::new();
    let mut lints_inherited = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.trim_matches(|c| c == '[' || c == ']').to_owned();
            continue;
        }
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if section == "lints" && line.replace(' ', "") == "workspace=true" {
            lints_inherited = true;
        }
        if section.ends_with("dependencies") && !line.replace(' ', "").contains("workspace=true") {
            problems.push(format!(
                "[{section}] `{line}`: pin versions in the root [workspace.dependencies] and write `.workspace = true`"
            ));
        }
    }
    if !lints_inherited {
        problems.push(String::from("must have `[lints] workspace = true`"));
    }
    problems
}

fn files(root: &Path, ext: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if path.is_dir() {
                if !(name.starts_with('.') || name == "target" || name == "outputs") {
                    stack.push(path);
                }
            } else if path.extension().is_some_and(|e| e == ext) {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

fn rel(root: &Path, p: &Path) -> String {
    p.strip_prefix(root).unwrap_or(p).display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tree_is_tidy() {
        check(&crate::workspace::project_root()).unwrap();
    }

    #[test]
    fn unsafe_code_is_recognised() {
        let kw = ["un", "safe"].concat();
        assert!(uses_unsafe(&format!("fn f() {{ {kw} {{ x() }} }}")));
        assert!(uses_unsafe(&format!("#![allow({kw}_code)]")));
        assert!(!uses_unsafe("// a safe function\nfn f() {}"));
    }

    #[test]
    fn member_versions_and_missing_lints_are_caught() {
        let bad = "[package]\nname = \"x\"\n\n[dependencies]\nserde = \"1\"\nfoo.workspace = true\n";
        let problems = manifest_problems(bad);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("serde"));
        let good = "[dependencies]\nfoo = { workspace = true, features = [\"x\"] }\n\n[lints]\nworkspace = true\n";
        assert!(manifest_problems(good).is_empty());
    }
}
