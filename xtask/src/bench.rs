//! `cargo xtask bench [NAME]`: benchmarks, each printed next to its reference measured in the same
//! run on the same machine, and the ratio. The Python references (PyTorch, PEFT, HF `generate`, TRL)
//! run in a virtual environment made on demand from PyPI (`target/bench-venv`, or the interpreter
//! named by `RL_BENCH_PYTHON`); `--no-reference` skips them. The benchmarks are never part of
//! `cargo xtask ci`; the venv is (`cargo xtask peft`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::Value;

use self::reference::{json_lines, print_out};
pub(crate) use self::reference::{reference_python, reference_venv};

mod gpu;
mod large;
mod reference;
mod rl_step;

/// Runs every benchmark (or the one named).
pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    // The GPU benchmark runs the CUDA binary of `cargo xtask build-cuda`, only when named, and
    // parses its own options.
    if args.first().map(String::as_str) == Some("gpu") {
        return gpu::run(args);
    }
    let Some(Selection { only, reference }) = select(args)? else {
        print_out(&format!("{USAGE}\n"));
        return Ok(());
    };
    crate::workspace::cargo(&["build", "--release", "--locked", "-p", "rl-cli"])?;
    let python = if reference && only.is_none_or(|o| ["generate", "train-step", "train-0.6b", "rl-step"].contains(&o)) {
        Some(reference_python()?)
    } else {
        None
    };
    let wants = |name: &str| only.is_none_or(|o| o == name);
    if wants("dry-run") {
        dry_run()?;
    }
    if wants("generate") {
        side_by_side(
            "decode tokens/s (batch 1: 128 new tokens, batch 32: 32, after 64-token prompts; 4x8: 4 prompts of 256 tokens x 8 samples, 32)",
            &["bench", "--locked", "-p", "rl-model", "--bench", "generate"],
            python.as_ref().map(|p| (p, "scripts/bench_hf_generate.py", "HF generate")),
            &["preset", "batch"],
        )?;
    }
    if wants("train-step") {
        side_by_side(
            "train step tokens/s (forward + backward + AdamW, 4 samples per row)",
            &["bench", "--locked", "-p", "rl-trainer", "--bench", "train_step"],
            python.as_ref().map(|p| (p, "scripts/bench_torch_train.py", "PyTorch")),
            &["preset", "tokens"],
        )?;
    }
    if wants("train-0.6b") {
        large::run(python.as_ref())?;
    }
    if wants("rl-step") {
        rl_step::run(python.as_ref())?;
    }
    if wants("env-server") {
        crate::workspace::cargo(&[
            "bench",
            "--locked",
            "-p",
            "rl-serve",
            "--features",
            "fake-model",
            "--bench",
            "run_group",
        ])?;
    }
    if wants("python-env") {
        crate::workspace::cargo(&["bench", "--locked", "-p", "rl-envs", "--bench", "python_env"])?;
    }
    Ok(())
}

const NAMES: [&str; 8] =
    ["dry-run", "generate", "train-step", "train-0.6b", "rl-step", "env-server", "python-env", "gpu"];

const USAGE: &str = "usage: cargo xtask bench [NAME] [--no-reference]
  NAME: one of dry-run, generate, train-step, train-0.6b, rl-step, env-server, python-env (all but gpu when omitted),
        or gpu [--rl PATH] [--device D] [--dtype T] [--preset P] [--tokens N] [--trainer-only]
  --no-reference: skip the Python references (PyTorch, PEFT, HF generate, TRL)";

/// Which benchmarks a command line asks for.
#[derive(Debug, PartialEq)]
struct Selection<'a> {
    only: Option<&'a str>,
    reference: bool,
}

/// Parses `[NAME] [--no-reference]`; `None` for `--help`. Anything else is an error rather than a
/// silent run of every benchmark (an hour on a 2-core machine).
fn select(args: &[String]) -> anyhow::Result<Option<Selection<'_>>> {
    let mut selection = Selection { only: None, reference: true };
    for arg in args {
        match arg.as_str() {
            "--help" | "-h" => return Ok(None),
            "--no-reference" => selection.reference = false,
            flag if flag.starts_with('-') => bail!("unknown option {flag:?}\n{USAGE}"),
            "gpu" => bail!("the gpu benchmark is named first: `cargo xtask bench gpu [OPTIONS]`"),
            name if NAMES.contains(&name) => {
                if let Some(first) = selection.only {
                    bail!("one benchmark at a time: both {first:?} and {name:?} were named");
                }
                selection.only = Some(name);
            }
            other => bail!("unknown benchmark {other:?}; expected one of {}", NAMES.join(", ")),
        }
    }
    Ok(Some(selection))
}

/// A row key from the fields `keys` of a result line.
fn key_of(v: &Value, keys: &[&str]) -> String {
    keys.iter().map(|k| format!("{k} {}", v[*k])).collect::<Vec<_>>().join(", ")
}

/// Runs our benchmark and its reference twice, interleaved, and prints the best of each per row
/// with the ratio.
fn side_by_side(
    title: &str,
    ours: &[&str],
    reference: Option<(&PathBuf, &str, &str)>,
    keys: &[&str],
) -> anyhow::Result<()> {
    let mut best: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    let mut note = String::new();
    for _ in 0..2 {
        let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| String::from("cargo")));
        for v in json_lines(cargo.args(ours), "our benchmark")? {
            let e = best.entry(key_of(&v, keys)).or_insert((0.0, 0.0));
            e.0 = e.0.max(v["tokens_per_s"].as_f64().unwrap_or(0.0));
            if let Some(extra) = v.get("note").and_then(Value::as_str) {
                note = extra.to_owned();
            }
        }
        if let Some((python, script, _)) = reference {
            for v in json_lines(crate::venv::command(python).arg(script), script)? {
                let e = best.entry(key_of(&v, keys)).or_insert((0.0, 0.0));
                e.1 = e.1.max(v["tokens_per_s"].as_f64().unwrap_or(0.0));
            }
        }
    }
    let name = reference.map_or("reference", |r| r.2);
    let mut out = format!("\n{title}\n{:<28} {:>12} {:>14} {:>8}\n", "case", "ours", name, "ratio");
    for (k, (a, b)) in &best {
        let ratio = if *b > 0.0 { format!("{:.2}x", a / b) } else { String::from("-") };
        out.push_str(&format!("{k:<28} {a:>12.0} {b:>14.0} {ratio:>8}\n"));
    }
    if !note.is_empty() {
        out.push_str(&format!("({note})\n"));
    }
    print_out(&out);
    Ok(())
}

/// `rl rl @ configs/reverse_text/rl.toml --dry-run` as a whole process; target: under 20 ms.
fn dry_run() -> anyhow::Result<()> {
    let out = std::env::temp_dir().join(format!("rl-bench-dry-run-{}", std::process::id()));
    let exe = crate::workspace::project_root().join("target/release/rl");
    let mut times = Vec::new();
    for i in 0..60 {
        let start = Instant::now();
        let status = Command::new(&exe)
            .args(["rl", "@", "configs/reverse_text/rl.toml", "--dry-run", "--output-dir"])
            .arg(&out)
            .stdout(std::process::Stdio::null())
            .status()
            .context("cannot run rl")?;
        if !status.success() {
            bail!("dry run failed ({status})");
        }
        if i >= 10 {
            times.push(start.elapsed());
        }
    }
    let _ = std::fs::remove_dir_all(&out);
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let median = times[times.len() / 2];
    let p90 = times[times.len() * 9 / 10];
    let verdict = if ms(median) < 20.0 { "meets" } else { "MISSES" };
    print_out(&format!(
        "\nrl rl --dry-run (whole process): median {:.2} ms, p90 {:.2} ms — {verdict} target < 20 ms\n",
        ms(median),
        ms(p90)
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{Selection, select};

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn selects_one_benchmark_or_all() {
        let all = args(&[]);
        assert_eq!(select(&all).unwrap(), Some(Selection { only: None, reference: true }));
        let one = args(&["rl-step", "--no-reference"]);
        assert_eq!(select(&one).unwrap(), Some(Selection { only: Some("rl-step"), reference: false }));
    }

    #[test]
    fn help_runs_nothing() {
        assert_eq!(select(&args(&["--help"])).unwrap(), None);
        assert_eq!(select(&args(&["generate", "-h"])).unwrap(), None);
    }

    #[test]
    fn rejects_what_it_does_not_know() {
        for bad in [&["--quick"][..], &["generte"], &["generate", "rl-step"], &["generate", "gpu"]] {
            let err = select(&args(bad)).unwrap_err().to_string();
            assert!(!err.is_empty(), "{bad:?}");
        }
        let err = select(&args(&["--quick"])).unwrap_err().to_string();
        assert!(err.contains("--quick") && err.contains("usage"), "{err}");
    }
}
