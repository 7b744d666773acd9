//! Benchmark: decode (and prefill) tokens/s of the CPU runtime at batch 1 and 32 for the `tiny` and
//! `small` presets (random weights, f32), one JSON line per case (`cargo xtask bench generate` prints
//! them next to HF `generate`'s). With the argument `qwen3-0.6b`: that shape's greedy decode after
//! 64-token prompts at batch 1, 8 and 32 (`cargo xtask bench train-0.6b` prints it).

// The printed table is this benchmark's output.
#![allow(clippy::print_stdout)]

use std::collections::HashMap;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use rl_model::{
    CausalLm, CpuRuntime, Lora, ModelConfig, Preset, SeqCache, init_adapters, merge_adapters, random_weights,
};

fn causal_lm(preset: Preset) -> CausalLm {
    let cfg = ModelConfig::preset(preset, preset.vocab_size().unwrap_or(128));
    let map: HashMap<String, Tensor> = random_weights(&cfg, 0).expect("weights").into_iter().collect();
    CausalLm::new(&cfg, &VarBuilder::from_tensors(map, DType::F32, &Device::Cpu)).expect("model")
}

fn model(preset: Preset) -> CpuRuntime {
    CpuRuntime::new(&causal_lm(preset)).expect("runtime")
}

fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32).map(|i| 8 + (i * 7 + salt) % 100).collect()
}

/// Prefill tokens/s: `batch` prompts of `len` tokens.
fn prefill(m: &CpuRuntime, batch: usize, len: usize) -> f64 {
    let start = Instant::now();
    for b in 0..batch {
        m.forward(&mut [&mut m.new_cache(None, len)], &[&prompt(len, b as u32)], false).expect("prefill");
    }
    (batch * len) as f64 / start.elapsed().as_secs_f64()
}

/// `batch` caches holding 64-token prompts, with room for `steps` more tokens.
fn prefilled(m: &CpuRuntime, batch: usize, steps: usize) -> Vec<SeqCache> {
    let mut caches: Vec<SeqCache> = (0..batch).map(|_| m.new_cache(None, 64 + steps)).collect();
    for (b, c) in caches.iter_mut().enumerate() {
        m.forward(&mut [c], &[&prompt(64, b as u32)], false).expect("prefill");
    }
    caches
}

/// Decode tokens/s: the sequences of `caches` (copied) decoding `steps` tokens together.
fn decode(m: &CpuRuntime, prefilled: &[SeqCache], steps: usize) -> f64 {
    let mut caches = prefilled.to_vec();
    let batch = caches.len();
    let start = Instant::now();
    for s in 0..steps {
        let tokens: Vec<[u32; 1]> = (0..batch as u32).map(|b| [8 + (b + s as u32) % 100]).collect();
        let toks: Vec<&[u32]> = tokens.iter().map(|t| &t[..]).collect();
        let mut refs: Vec<&mut SeqCache> = caches.iter_mut().collect();
        m.forward(&mut refs, &toks, false).expect("decode");
    }
    (batch * steps) as f64 / start.elapsed().as_secs_f64()
}

/// `prompts` prompts of `len` tokens, each prefilled once and shared by `n` caches (the samples of
/// a GRPO group), with room for `steps` more tokens each.
fn grouped(m: &CpuRuntime, prompts: usize, n: usize, len: usize, steps: usize) -> Vec<SeqCache> {
    let mut caches = Vec::with_capacity(prompts * n);
    for p in 0..prompts {
        let mut c = m.new_cache(None, len);
        m.forward(&mut [&mut c], &[&prompt(len, p as u32)], false).expect("prefill");
        let shared = c.into_shared();
        caches.extend((0..n).map(|_| m.new_cache(Some(&shared), steps)));
    }
    caches
}

/// The Qwen3-0.6B shape: 32 new tokens after 64-token prompts, batch 1, 8 and 32 (the best of two;
/// 32 sequences, as an RL step's rollouts decode together, run the 12-row tiles):
/// `f32` random f32 weights; `ckpt-bf16` the same weights rounded to bf16, as a checkpoint stored
/// in bf16 (every released Qwen3) holds them, computed in f32 (the runtime packs such matrices in
/// bf16, losslessly); `bf16` the f32 weights packed in bf16 (rounded: a bf16 model); `lora` the
/// bf16 checkpoint with r = 16 adapters on every projection computed unmerged, `lora-merged` the
/// same adapters merged into it (ours only: the reference is each other).
fn qwen3_0_6b() {
    let lm = causal_lm(Preset::Qwen3_0_6B);
    let cfg = ModelConfig::preset(Preset::Qwen3_0_6B, 151_936);
    let rounded: HashMap<String, Tensor> = random_weights(&cfg, 0)
        .expect("weights")
        .into_iter()
        .map(|(k, t)| {
            let t = if t.rank() == 2 { t.to_dtype(DType::BF16).and_then(|t| t.to_dtype(DType::F32)) } else { Ok(t) };
            (k, t.expect("rounded"))
        })
        .collect();
    let lm_ckpt =
        CausalLm::new(&cfg, &VarBuilder::from_tensors(rounded.clone(), DType::F32, &Device::Cpu)).expect("model");
    // LoRA r = 16 on every projection over the bf16 checkpoint: computed apart from the base
    // (which stays packed in bf16), and merged into it (the merged matrices are f32).
    let lora = Lora::from_config(&rl_configs::LoraConfig::default());
    let mut adapters = init_adapters(&cfg, &lora, 0, &Device::Cpu).expect("adapters");
    for (name, t) in adapters.iter_mut() {
        if name.contains(".lora_B.") {
            *t = Tensor::randn(0f32, 0.01, t.dims(), &Device::Cpu).expect("B");
        }
    }
    // Each runtime is built when its case runs (five at once would not fit in memory).
    type Build<'a> = Box<dyn Fn() -> rl_model::Result<CpuRuntime> + 'a>;
    let cases: [(&str, Build<'_>); 5] = [
        ("f32", Box::new(|| CpuRuntime::new(&lm))),
        ("ckpt-bf16", Box::new(|| CpuRuntime::new(&lm_ckpt))),
        ("bf16", Box::new(|| CpuRuntime::with_weight_dtype(&lm, DType::BF16))),
        ("lora", Box::new(|| CpuRuntime::new(&lm_ckpt)?.with_adapters(&lora, &adapters))),
        (
            "lora-merged",
            Box::new(|| {
                let merged = merge_adapters(&cfg, &lora, &rounded, &adapters)?;
                CpuRuntime::new(&CausalLm::new(&cfg, &VarBuilder::from_tensors(merged, DType::F32, &Device::Cpu))?)
            }),
        ),
    ];
    for (weights, build) in cases {
        let m = build().expect("runtime");
        let _ = decode(&m, &prefilled(&m, 1, 2), 2);
        for batch in [1usize, 8, 32] {
            let caches = prefilled(&m, batch, 32);
            let d = (0..2).map(|_| decode(&m, &caches, 32)).fold(0.0, f64::max);
            println!(
                "{}",
                serde_json::json!({"bench": "decode-0.6b", "preset": "qwen3-0.6b", "weights": weights, "batch": batch,
                                   "tokens_per_s": d})
            );
        }
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
    // `cargo bench -p rl-model --bench generate -- small 32` runs one case (for profiling; batches
    // 1, 32, 4x8).
    let only: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let skip =
        |what: &str, all: &[&str]| only.iter().any(|o| all.contains(&o.as_str())) && !only.iter().any(|o| o == what);
    // `--profile`: the decode runs only, a hundred times (a profile of decoding alone).
    let profile = std::env::args().any(|a| a == "--profile");
    for (name, preset) in [("tiny", Preset::Tiny), ("small", Preset::Small)] {
        if skip(name, &["tiny", "small"]) {
            continue;
        }
        let m = model(preset);
        let _ = decode(&m, &prefilled(&m, 1, 4), 4);
        for batch in [1usize, 32] {
            if skip(&batch.to_string(), &["1", "32", "4x8"]) {
                continue;
            }
            let steps = if batch == 1 { 128 } else { 32 };
            let caches = prefilled(&m, batch, steps);
            if profile {
                let best = (0..100).map(|_| decode(&m, &caches, steps)).fold(0.0, f64::max);
                println!(
                    "{}",
                    serde_json::json!({"bench": "decode", "preset": name, "batch": batch, "tokens_per_s": best})
                );
                continue;
            }
            let p = prefill(&m, batch, 256);
            // The best of five runs (a run is tens of milliseconds on a shared, noisy machine).
            let d = (0..5).map(|_| decode(&m, &caches, steps)).fold(0.0, f64::max);
            let line = serde_json::json!({"bench": "decode", "preset": name, "batch": batch, "tokens_per_s": d, "prefill_tokens_per_s": p});
            println!("{line}");
        }
        // GRPO-shaped: 4 prompts of 256 tokens x 8 samples each, 32 new tokens.
        if !skip("4x8", &["1", "32", "4x8"]) {
            let caches = grouped(&m, 4, 8, 256, 32);
            let d = (0..5).map(|_| decode(&m, &caches, 32)).fold(0.0, f64::max);
            println!("{}", serde_json::json!({"bench": "decode", "preset": name, "batch": "4x8", "tokens_per_s": d}));
        }
    }
}
