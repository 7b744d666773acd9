//! `cargo xtask bench`: whole-process benchmarks that report against their targets.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// Runs every benchmark (or the one named).
pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    let only = args.first().map(String::as_str);
    crate::cargo(&["build", "--release", "--locked", "-p", "rl-cli"])?;
    if only.is_none_or(|o| o == "dry-run") {
        dry_run()?;
    }
    if only.is_none_or(|o| o == "generate") {
        crate::cargo(&["bench", "--locked", "-p", "rl-model", "--bench", "generate"])?;
    }
    if only.is_none_or(|o| o == "train-step") {
        crate::cargo(&["bench", "--locked", "-p", "rl-trainer", "--bench", "train_step"])?;
    }
    if only.is_none_or(|o| o == "env-server") {
        crate::cargo(&["bench", "--locked", "-p", "rl-serve", "--features", "fake-model", "--bench", "run_group"])?;
    }
    Ok(())
}

/// `rl rl @ configs/reverse_text/rl.toml --dry-run` as a whole process; target: under 20 ms.
fn dry_run() -> anyhow::Result<()> {
    let out = std::env::temp_dir().join(format!("rl-bench-dry-run-{}", std::process::id()));
    let exe = crate::project_root().join("target/release/rl");
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
    report(
        "rl rl --dry-run (whole process)",
        &format!("median {:.2} ms, p90 {:.2} ms", ms(median), ms(p90)),
        ms(median) < 20.0,
        "< 20 ms",
    );
    Ok(())
}

fn report(name: &str, measured: &str, met: bool, target: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let verdict = if met { "meets" } else { "MISSES" };
    let _ = writeln!(out, "{name:<40} {measured:<36} {verdict} target {target}");
}
