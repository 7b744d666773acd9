//! Benchmark: train-step tokens/s (forward + backward + AdamW) for the `tiny` and `small` presets at
//! 512 and 2048 tokens per micro-batch (4 samples), one JSON line per case (`cargo xtask bench
//! train-step` prints them next to PyTorch's). With the argument `qwen3-0.6b`: that preset's full
//! step and LoRA (r = 16 on every projection) step at 512 tokens, each with its peak resident
//! memory (`cargo xtask bench train-0.6b`, next to PyTorch and PyTorch + PEFT).

// The printed table is this benchmark's output.
#![allow(clippy::print_stdout)]

use std::collections::HashMap;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use rl_configs::{LossConfig, OptimConfig};
use rl_model::{Lora, ModelConfig, Preset, Trainable, random_weights};
use rl_trainer::{MicroBatch, Optimizer, StepId, step_counts, step_gradients};

/// Packed row of `tokens` tokens: 4 samples, every completion token trained.
fn row(tokens: usize) -> MicroBatch {
    let per = tokens / 4;
    let ids: Vec<u32> = (0..tokens as u32).map(|i| 8 + (i * 13) % 100).collect();
    MicroBatch {
        input_ids: ids,
        position_ids: (0..4).flat_map(|_| 0..per as u32).collect(),
        seq_lens: vec![per as u32; 4],
        loss_mask: (0..tokens).map(|i| i % per >= per / 4).collect(),
        advantages: (0..tokens).map(|i| if i % 2 == 0 { 1.0 } else { -1.0 }).collect(),
        inference_logprobs: vec![-4.0; tokens],
        temperatures: vec![1.0; tokens],
        ce_weights: vec![],
        env_index: vec![0; tokens],
        parents: vec![],
    }
}

/// Forward+backward FLOPs per token: 6 x matmul params (incl. the output head) + attention.
fn flops_per_token(cfg: &ModelConfig, sample_len: usize) -> f64 {
    let h = cfg.hidden_size;
    let (q, kv) = (cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim);
    let per_layer = h * q + 2 * h * kv + q * h + 3 * h * cfg.intermediate_size;
    let matmul = cfg.num_hidden_layers * per_layer + cfg.vocab_size * h;
    6.0 * matmul as f64 + 12.0 * (cfg.num_hidden_layers * q * sample_len) as f64
}

fn matmul_gflops() -> f64 {
    let n = 1024;
    let a = Tensor::ones((n, n), DType::F32, &Device::Cpu).expect("a");
    let b = Tensor::ones((n, n), DType::F32, &Device::Cpu).expect("b");
    let _ = a.matmul(&b).expect("warm up");
    let start = Instant::now();
    let reps = 5;
    for _ in 0..reps {
        let _ = a.matmul(&b).expect("matmul");
    }
    2.0 * (n * n * n) as f64 * reps as f64 / start.elapsed().as_secs_f64() / 1e9
}

/// Resets the process's peak resident set (Linux: `clear_refs` 5), so the next reading of
/// [`peak_rss_mb`] is this case's.
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Peak resident set since the last reset, MiB (`VmHWM`).
fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok());
    kb.unwrap_or(0.0) / 1024.0
}

/// Minor page faults of this process so far (`/proc/self/stat` field 10): each is a fresh page
/// the kernel zeroed, what reusing large blocks avoids.
fn minor_faults() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name, which may hold spaces.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    rest.split_whitespace().nth(7).and_then(|f| f.parse().ok()).unwrap_or(0)
}

/// The Qwen3-0.6B-shaped cases: a full step and a LoRA step (r = 16, alpha 32, every projection)
/// of one 512-token row, each timed over two steps after a warm-up one, with its peak memory; and
/// the LoRA step over a base whose values are bf16 values (a bf16 checkpoint, as released models
/// are stored, read in f32), which the trainer holds in bf16.
fn qwen3_0_6b() {
    let cfg = ModelConfig::preset(Preset::Qwen3_0_6B, 151_936);
    // `-- qwen3-0.6b lora` (or `full`, `lora-bf16`) runs one of them (for profiling).
    let args: Vec<String> = std::env::args().collect();
    let modes = ["full", "lora", "lora-bf16"];
    let one = modes.into_iter().find(|m| args.iter().any(|a| a == m));
    for mode in modes.into_iter().filter(|m| one.is_none_or(|o| o == *m)) {
        reset_peak_rss();
        // The bf16 case's weights as the trainer reads a bf16 checkpoint for LoRA: in bf16.
        let dtype = if mode == "lora-bf16" { DType::BF16 } else { DType::F32 };
        let map: HashMap<String, Tensor> =
            rl_model::random_weights_as(&cfg, 0, dtype).expect("weights").into_iter().collect();
        let vars = if mode == "full" {
            // The trainer drops the tensors it read once they are variables: so does this.
            let vars = Trainable::from_tensors(&cfg, &map).expect("vars");
            drop(map);
            vars
        } else {
            let lora = Lora::from_config(&rl_configs::LoraConfig::default());
            let adapters = rl_model::init_adapters(&cfg, &lora, 0, &Device::Cpu).expect("adapters");
            Trainable::with_adapters(&cfg, map, &lora, &adapters).expect("vars")
        };
        let model = vars.model(&cfg, &Device::Cpu).expect("model");
        // As the trainer does once its model is loaded.
        rl_kernels::release_kept_blocks();
        let mut opt = Optimizer::new(&OptimConfig::default());
        let tokens = 512;
        let mb = row(tokens);
        let counts = step_counts(std::slice::from_ref(&mb)).expect("counts");
        // Each step returns its split, as the trainer's metrics record it (`time/*_s`).
        let mut step = || {
            let rows = std::slice::from_ref(&mb);
            let (g, _, t) =
                step_gradients(&model, &vars, rows, &LossConfig::default(), counts, StepId { step: 1, seed: 0 })
                    .expect("gradients");
            let update = Instant::now();
            opt.step(&vars.vars, &g, 1e-4, 1.0).expect("adamw");
            [t.forward_s, t.backward_s, update.elapsed().as_secs_f64()]
        };
        step();
        let (start, faults) = (Instant::now(), minor_faults());
        let reps = 2;
        let mut spent = [0.0f64; 3];
        for _ in 0..reps {
            let split = step();
            spent.iter_mut().zip(split).for_each(|(a, b)| *a += b / reps as f64);
        }
        let tps = (tokens * reps) as f64 / start.elapsed().as_secs_f64();
        let faults_per_step = (minor_faults() - faults) / reps as u64;
        let [forward_s, backward_s, optimizer_s] = spent;
        let line = serde_json::json!({"bench": "train-0.6b", "preset": "qwen3-0.6b", "mode": mode, "tokens": tokens, "tokens_per_s": tps, "peak_rss_mb": peak_rss_mb(), "page_faults_per_step": faults_per_step, "forward_s": forward_s, "backward_s": backward_s, "optimizer_s": optimizer_s});
        println!("{line}");
    }
}

/// The allocator `rl` runs with.
#[global_allocator]
static ALLOC: rl_kernels::LargeBlockCache = rl_kernels::LargeBlockCache::new();

fn main() {
    rl_kernels::tune_process();
    if std::env::args().any(|a| a == "qwen3-0.6b") {
        qwen3_0_6b();
        return;
    }
    let peak = matmul_gflops();
    // `cargo bench -p rl-trainer --bench train_step -- small 512` runs one case (for profiling);
    // `-- lora` trains adapters instead of every weight.
    let only: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let wanted = |what: &str| only.is_empty() || only.iter().any(|o| o == what);
    for (name, preset) in [("tiny", Preset::Tiny), ("small", Preset::Small)] {
        if !wanted(name) && only.iter().any(|o| o == "tiny" || o == "small") {
            continue;
        }
        let cfg = ModelConfig::preset(preset, 128);
        let map: HashMap<String, Tensor> = random_weights(&cfg, 0).expect("weights").into_iter().collect();
        // `-- lora`: the same cases training LoRA adapters (r = 16, every projection) instead.
        let lora = only.iter().any(|o| o == "lora");
        let vars = if lora {
            let l = Lora::from_config(&rl_configs::LoraConfig::default());
            let adapters = rl_model::init_adapters(&cfg, &l, 0, &Device::Cpu).expect("adapters");
            Trainable::with_adapters(&cfg, map, &l, &adapters).expect("vars")
        } else {
            Trainable::from_tensors(&cfg, &map).expect("vars")
        };
        let model = vars.model(&cfg, &Device::Cpu).expect("model");
        let mut opt = Optimizer::new(&OptimConfig::default());
        for tokens in [512usize, 2048] {
            if !wanted(&tokens.to_string()) && only.iter().any(|o| o == "512" || o == "2048") {
                continue;
            }
            let mb = row(tokens);
            let counts = step_counts(std::slice::from_ref(&mb)).expect("counts");
            // The trainer's own path: gradients of the step's rows, then the optimizer.
            let mut step = || {
                let rows = std::slice::from_ref(&mb);
                let (g, _, _) =
                    step_gradients(&model, &vars, rows, &LossConfig::default(), counts, StepId { step: 1, seed: 0 })
                        .expect("gradients");
                opt.step(&vars.vars, &g, 1e-4, 1.0).expect("adamw");
            };
            step();
            // The best of three timed windows (the machine is shared; one window is noisy).
            let reps = if tokens > 1000 { 2 } else { 6 };
            let tps = (0..3)
                .map(|_| {
                    let start = Instant::now();
                    for _ in 0..reps {
                        step();
                    }
                    (tokens * reps) as f64 / start.elapsed().as_secs_f64()
                })
                .fold(0.0, f64::max);
            let gflops = flops_per_token(&cfg, tokens / 4) * tps / 1e9;
            let note = format!("machine: f32 matmul 1024x1024 {peak:.1} GFLOP/s");
            let name = if lora { format!("{name} (LoRA)") } else { name.to_owned() };
            let line = serde_json::json!({"bench": "train-step", "preset": name, "tokens": tokens, "tokens_per_s": tps, "gflops": gflops, "note": note});
            println!("{line}");
        }
    }
}
