//! `cargo xtask bench train-0.6b`: the Qwen3-0.6B shape's full and LoRA (r = 16, every
//! projection) train steps, ours next to PyTorch and PyTorch + PEFT measured in the same run, with
//! each side's peak memory (and our LoRA step over a bf16 checkpoint's values, whose base the
//! trainer holds in bf16, next to PEFT's f32 step); then our LoRA step against our full step; then
//! greedy decode at batch 1, 8 and 32 next to HF `generate`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use super::reference::{json_lines, print_out};

/// Runs both sides once (each case takes a minute or more on 2 cores) and prints the table.
pub(crate) fn run(python: Option<&PathBuf>) -> anyhow::Result<()> {
    // Each case in its own process, so each peak is its own (a process keeps freed blocks).
    let mut lines = Vec::new();
    for mode in ["full", "lora", "lora-bf16"] {
        let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| String::from("cargo")));
        cargo.args(["bench", "--locked", "-p", "rl-trainer", "--bench", "train_step", "--", "qwen3-0.6b", mode]);
        lines.extend(json_lines(&mut cargo, "our benchmark")?);
    }
    let ours = by_mode(&lines);
    let theirs = match python {
        Some(p) => by_mode(&json_lines(
            crate::venv::command(p).args(["scripts/bench_torch_train.py", "qwen3-0.6b"]),
            "PyTorch",
        )?),
        None => BTreeMap::new(),
    };
    let mut out = String::from(
        "\ntrain step, qwen3-0.6b shape (f32, one 512-token row of 4 samples; LoRA r=16 alpha 32 on q/k/v/o/gate/up/down)\n",
    );
    out.push_str(&format!(
        "{:<9} {:>10} {:>12} {:>7} {:>11} {:>13} {:>7}\n",
        "case", "ours tok/s", "torch tok/s", "ratio", "ours peak", "torch peak", "ratio"
    ));
    let name = |m: &str| if m == "full" { "full (PyTorch)" } else { "LoRA (PyTorch + PEFT, f32)" };
    for (mode, (tps, mb)) in &ours {
        // A bf16 checkpoint's values in f32 are PEFT's LoRA case as it is.
        let (rtps, rmb) = theirs.get(mode.trim_end_matches("-bf16")).copied().unwrap_or((0.0, 0.0));
        let ratio = |a: f64, b: f64| if b > 0.0 { format!("{:.2}x", a / b) } else { String::from("-") };
        out.push_str(&format!(
            "{mode:<9} {tps:>10.1} {rtps:>12.1} {:>7} {:>8.0} MB {:>10.0} MB {:>7}   vs {}\n",
            ratio(*tps, rtps),
            mb,
            rmb,
            ratio(*mb, rmb),
            name(mode)
        ));
    }
    if let (Some((full, full_mb)), Some((lora, lora_mb))) = (ours.get("full"), ours.get("lora")) {
        out.push_str(&format!(
            "ours, LoRA vs full: {:.2}x the speed, {:.0}% of the peak memory\n",
            lora / full,
            100.0 * lora_mb / full_mb
        ));
    }
    if let (Some((_, full_mb)), Some((lora, lora_mb))) = (ours.get("full"), ours.get("lora-bf16")) {
        out.push_str(&format!(
            "ours, LoRA over a bf16 checkpoint (base held in bf16): {lora:.1} tok/s, {:.0}% of the full step's peak memory\n",
            100.0 * lora_mb / full_mb
        ));
    }
    print_out(&out);
    decode(python)
}

/// The decode cases in the order printed (`crates/rl-model/benches/generate.rs` says what each is).
const CASES: [&str; 5] = ["f32", "ckpt-bf16", "bf16", "lora", "lora-merged"];

/// Greedy decode at the 0.6B shape, ours and HF `generate`'s, by weight dtype and batch.
fn decode(python: Option<&PathBuf>) -> anyhow::Result<()> {
    let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| String::from("cargo")));
    cargo.args(["bench", "--locked", "-p", "rl-model", "--bench", "generate", "--", "qwen3-0.6b"]);
    let by_case = |lines: &[Value]| -> BTreeMap<(String, u64), f64> {
        lines
            .iter()
            .filter_map(|v| {
                let weights = v["weights"].as_str().unwrap_or("f32").to_owned();
                Some(((weights, v["batch"].as_u64()?), v["tokens_per_s"].as_f64()?))
            })
            .collect()
    };
    let ours = by_case(&json_lines(&mut cargo, "our decode benchmark")?);
    let theirs = match python {
        Some(p) => by_case(&json_lines(
            crate::venv::command(p).args(["scripts/bench_hf_generate.py", "qwen3-0.6b"]),
            "HF generate",
        )?),
        None => BTreeMap::new(),
    };
    let mut out = String::from(
        "\ngreedy decode tokens/s, qwen3-0.6b shape (32 new tokens after 64-token prompts; ckpt-bf16: f32 compute of \
         weights stored in bf16, as released checkpoints are; bf16: weights in bf16; lora: ckpt-bf16 with LoRA r=16 on \
         every projection, unmerged (HF: PEFT); lora-merged: the same merged)\n",
    );
    out.push_str(&format!(
        "{:<12} {:<6} {:>10} {:>12} {:>7} {:>14}\n",
        "weights", "batch", "ours", "HF generate", "ratio", "vs HF f32"
    ));
    let ratio = |a: f64, b: Option<f64>| match b {
        Some(b) if b > 0.0 => format!("{:.2}x", a / b),
        _ => String::from("-"),
    };
    let mut cases: Vec<_> = ours.iter().collect();
    let order = |w: &str| CASES.iter().position(|o| *o == w).unwrap_or(CASES.len());
    cases.sort_by_key(|((weights, batch), _)| (order(weights), *batch));
    for ((weights, batch), tps) in cases {
        let hf = theirs.get(&(weights.clone(), *batch)).copied();
        let hf32 = theirs.get(&(String::from("f32"), *batch)).copied();
        out.push_str(&format!(
            "{weights:<12} {batch:<6} {tps:>10.1} {:>12.1} {:>7} {:>14}\n",
            hf.unwrap_or(0.0),
            ratio(*tps, hf),
            ratio(*tps, hf32)
        ));
    }
    print_out(&out);
    Ok(())
}

/// (tokens/s, peak MiB) by mode.
fn by_mode(lines: &[Value]) -> BTreeMap<String, (f64, f64)> {
    lines
        .iter()
        .filter_map(|v| {
            let mode = v["mode"].as_str()?.to_owned();
            Some((mode, (v["tokens_per_s"].as_f64()?, v["peak_rss_mb"].as_f64().unwrap_or(0.0))))
        })
        .collect()
}
