//! `cargo xtask bench rl-step`: seconds per RL step of the whole stack (`rl rl`: inference server,
//! env server, trainer, orchestrator as processes) on the fixed workload of
//! `configs/bench/rl_step.toml`, next to TRL's `GRPOTrainer` on the same workload and model
//! (`scripts/bench_trl_grpo.py`), with peak memory: the sum over our processes vs TRL's one.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;

/// Resident set size of `pid` in MiB (0 when it is gone).
fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).map(str::to_owned))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|kb| kb.parse::<f64>().ok()))
        .map_or(0.0, |kb| kb / 1024.0)
}

/// `root` and its descendants (from /proc).
fn tree(root: u32) -> Vec<u32> {
    let mut parent_of = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for e in entries.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // Field 4 (ppid) follows the parenthesised command name.
            let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
            if let Some(ppid) = ppid {
                parent_of.push((pid, ppid));
            }
        }
    }
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        let p = out[i];
        out.extend(parent_of.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    out
}

/// Runs our RL steps; returns (mean seconds per step after the first two, peak summed RSS MiB).
fn ours(model: &Path, out: &Path) -> anyhow::Result<(f64, f64, usize)> {
    let exe = crate::workspace::project_root().join("target/release/rl");
    let mut child = Command::new(&exe)
        .args(["rl", "@", "configs/bench/rl_step.toml", "--clean", "--model.path"])
        .arg(model)
        .arg("--output-dir")
        .arg(out)
        .stdout(std::process::Stdio::null())
        .spawn()
        .context("cannot start rl rl")?;
    let mut peak = 0f64;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        peak = peak.max(tree(child.id()).into_iter().map(rss_mib).sum());
        std::thread::sleep(Duration::from_millis(100));
    };
    if !status.success() {
        bail!("rl rl failed ({status}); see {}/bench-rl-step/logs", out.display());
    }
    let metrics = out.join("bench-rl-step/metrics.jsonl");
    let text = std::fs::read_to_string(&metrics).with_context(|| format!("cannot read {}", metrics.display()))?;
    let rows: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["step"].as_u64().is_some_and(|s| s > 2))
        .collect();
    let steps: Vec<f64> = rows.iter().filter_map(|v| v["time/step_s"].as_f64()).collect();
    if steps.is_empty() {
        bail!("{} has no step times", metrics.display());
    }
    // A step that trains nothing is not the workload TRL runs (it always trains all 64 samples).
    if let Some(v) = rows.iter().find(|v| v["samples"].as_f64() != Some(64.0)) {
        bail!("step {} trained {} samples, not 64: the comparison would be unfair", v["step"], v["samples"]);
    }
    Ok((steps.iter().sum::<f64>() / steps.len() as f64, peak, steps.len()))
}

pub(crate) fn run(python: Option<&PathBuf>) -> anyhow::Result<()> {
    let root = crate::workspace::project_root().join("target/bench/rl-step");
    let model = root.join("tiny");
    let exe = crate::workspace::project_root().join("target/release/rl");
    let status = Command::new(&exe)
        .args(["model", "init", "--preset", "tiny", "--seed", "0", "--force", "--out"])
        .arg(&model)
        .stdout(std::process::Stdio::null())
        .status()
        .context("cannot run rl model init")?;
    if !status.success() {
        bail!("rl model init failed ({status})");
    }
    let (s, mem, n) = ours(&model, &root.join("runs"))?;
    let mut text = format!(
        "\nRL step, tiny, 8 prompts x 8 samples, <= 32 completion tokens, on-policy\n  rl (4 processes): {s:.2} s/step (mean of {n}), peak memory {mem:.0} MiB (sum)\n"
    );
    if let Some(python) = python {
        let lines = super::reference::json_lines(
            crate::venv::command(python).arg("scripts/bench_trl_grpo.py").arg(&model).arg("8"),
            "the TRL reference",
        )?;
        let v = lines.last().context("the TRL reference printed no result")?;
        let (ts, tm) = (v["seconds_per_step"].as_f64().unwrap_or(0.0), v["peak_rss_mb"].as_f64().unwrap_or(0.0));
        text.push_str(&format!(
            "  TRL {} GRPOTrainer: {ts:.2} s/step, peak memory {tm:.0} MiB\n  speed-up {:.2}x; memory {:.2}x of TRL's\n",
            v["trl"].as_str().unwrap_or("?"),
            ts / s,
            mem / tm.max(1e-9)
        ));
    }
    super::reference::print_out(&text);
    Ok(())
}
