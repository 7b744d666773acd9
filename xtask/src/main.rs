//! Project automation, the one entry point for CI: `cargo xtask ci` runs fmt, tidy, dependency
//! rules and unused dependencies, clippy (CPU and `cuda` feature), every test, the Python SDK's tests and the example env crate (its tests, then two RL steps on it); `cargo xtask bench` runs the benchmarks;
//! `cargo xtask build-cuda` links a GPU binary from PyPI's CUDA wheels.

mod bench;
mod cuda;
mod deps;
mod example_env;
mod module_graph;
mod peft;
mod python;
mod tidy;
mod unused_deps;
mod venv;
mod verifiers;
mod workspace;

use std::process::Command;

use anyhow::{Context, bail};

use crate::workspace::{cargo, eprintln_flush, project_root};

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln_flush(&format!("error: {e:#}"));
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = project_root();
    std::env::set_current_dir(&root).with_context(|| format!("cannot enter {}", root.display()))?;
    match args.first().map(String::as_str) {
        Some("ci") => ci(&args[1..]),
        Some("tidy") => tidy::check(&root),
        Some("deps") => deps::check().and_then(|()| unused_deps::check()),
        Some("bench") => bench::run(&args[1..]),
        Some("build-cuda") => cuda::build(),
        Some("clippy-cuda") => cuda::clippy(),
        Some("python-sdk") => python::test(),
        Some("example-env") => example_env::check(),
        Some("verifiers") => verifiers::test(),
        Some("peft") => peft::check(),
        _ => bail!(
            "usage: cargo xtask <ci [--gpu] | tidy | deps | bench | build-cuda | clippy-cuda | python-sdk | example-env | verifiers | peft>"
        ),
    }
}

/// Every check, cheapest first; stops at the first failure.
fn ci(args: &[String]) -> anyhow::Result<()> {
    let gpu = args.iter().any(|a| a == "--gpu");
    let features: &[&str] = if gpu { &["--features", cuda::FEATURES] } else { &[] };
    step("fmt", || cargo(&["fmt", "--all", "--", "--check"]))?;
    step("tidy", || tidy::check(&project_root()))?;
    step("dependency rules", deps::check)?;
    step("unused dependencies", unused_deps::check)?;
    // pip's downloads (torch alone is gigabytes) wait on the network, not the CPU: they run
    // while cargo compiles, and each Python step below finds its venv made.
    let venvs = venv::Prefetch::start(prefetched_venvs());
    // One build lints the workspace (clippy's driver, warnings denied) and makes every target's
    // binaries; the benches (`harness = false`) are built here so they are linted too.
    let lint = workspace::linted_build_env()?;
    let lint = workspace::as_env(&lint);
    step("clippy and test build", || {
        let mut a = vec!["test", "--workspace", "--all-targets", "--locked", "--no-run"];
        a.extend_from_slice(features);
        workspace::cargo_env(&a, &lint)
    })?;
    step("tests", || {
        let mut a = if has_nextest() {
            vec!["nextest", "run", "--workspace", "--locked", "--no-fail-fast"]
        } else {
            vec!["test", "--workspace", "--locked", "--no-fail-fast"]
        };
        a.extend_from_slice(features);
        workspace::cargo_env(&a, &lint)
    })?;
    // The CPU kernels dispatch at run time to AVX-512 or AVX2 tiles of different shapes; on an
    // AVX-512 machine the run above tests only the first, so the kernels' and the model's tests
    // (the fused ops and the decode runtime against their references) run again capped at AVX2.
    if has_avx512() {
        step("kernel tests on AVX2 (RL_SIMD=avx2)", || {
            // The whole workspace's build with a filter: `-p` alone resolves features anew and
            // rebuilt 77 crates (3 minutes); plain `cargo test` has no filter, so runs them all.
            let mut a = if has_nextest() {
                vec![
                    "nextest",
                    "run",
                    "--workspace",
                    "--locked",
                    "--no-fail-fast",
                    "-E",
                    "package(rl-kernels) | package(rl-model)",
                ]
            } else {
                vec!["test", "--workspace", "--locked", "--no-fail-fast"]
            };
            a.extend_from_slice(features);
            let mut env = lint.clone();
            env.push(("RL_SIMD", std::ffi::OsStr::new("avx2")));
            workspace::cargo_env(&a, &env)
        })?;
    }
    venvs.wait();
    step("python sdk tests", python::test)?;
    step("example env crate", example_env::check)?;
    step("verifiers environments", verifiers::test)?;
    step("LoRA adapters against PEFT", peft::check)?;
    // Last, being the slowest on a clean machine: the GPU code compiles everywhere (the CUDA
    // compiler comes from PyPI wheels; candle's kernels compile to PTX).
    step("clippy (cuda feature)", cuda::clippy)?;
    eprintln_flush("xtask ci: all checks passed");
    Ok(())
}

/// Every venv a later step uses, in the order the steps use them.
fn prefetched_venvs() -> Vec<venv::Venv> {
    let mut all = vec![python::venv(), verifiers::venv()];
    all.extend(bench::reference_venv());
    all.push(cuda::compiler_venv());
    all
}

fn step(name: &str, f: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<()> {
    eprintln_flush(&format!("==> {name}"));
    let start = std::time::Instant::now();
    f().with_context(|| format!("ci step `{name}` failed"))?;
    eprintln_flush(&format!("    {name} ok ({:.1}s)", start.elapsed().as_secs_f64()));
    Ok(())
}

/// Whether this CPU runs the kernels' AVX-512 tiles (then their AVX2 ones need a run of their own).
fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx512f");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

fn has_nextest() -> bool {
    Command::new("cargo").args(["nextest", "--version"]).output().is_ok_and(|o| o.status.success())
}
