//! Scratch: time of forward, backward and optimizer of one train step.
#![allow(clippy::print_stdout)]
use candle_core::{Device, Tensor};
use rl_configs::{LossConfig, OptimConfig};
use rl_model::{Preset, Qwen3Config, Trainable, random_weights};
use rl_trainer::{MicroBatch, Optimizer, micro_loss, step_counts};
use std::collections::HashMap;
use std::time::Instant;

fn row(tokens: usize) -> MicroBatch {
    let per = tokens / 4;
    MicroBatch {
        input_ids: (0..tokens as u32).map(|i| 8 + (i * 13) % 100).collect(),
        position_ids: (0..4).flat_map(|_| 0..per as u32).collect(),
        seq_lens: vec![per as u32; 4],
        loss_mask: (0..tokens).map(|i| i % per >= per / 4).collect(),
        advantages: (0..tokens).map(|i| if i % 2 == 0 { 1.0 } else { -1.0 }).collect(),
        inference_logprobs: vec![-4.0; tokens],
        temperatures: vec![1.0; tokens],
        env_index: vec![0; tokens],
        ..Default::default()
    }
}

fn main() {
    let preset = if std::env::args().nth(1).as_deref() == Some("tiny") { Preset::Tiny } else { Preset::Small };
    let tokens: usize = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(2048);
    let cfg = Qwen3Config::preset(preset, 128);
    let map: HashMap<String, Tensor> = random_weights(&cfg, 0).unwrap().into_iter().collect();
    let vars = Trainable::from_tensors(&cfg, &map).unwrap();
    let model = vars.model(&cfg, &Device::Cpu).unwrap();
    let mut opt = Optimizer::new(&OptimConfig::default());
    let mb = row(tokens);
    let counts = step_counts(std::slice::from_ref(&mb)).unwrap();
    let (mut f, mut b, mut o) = (f64::MAX, f64::MAX, f64::MAX);
    for i in 0..8 {
        let t0 = Instant::now();
        let (loss, _) = micro_loss(&model, &mb, &LossConfig::default(), counts).unwrap();
        let t1 = Instant::now();
        let grads = loss.backward().unwrap();
        let t2 = Instant::now();
        let g: Vec<Tensor> = vars.vars.iter().map(|(_, v)| grads.get(v.as_tensor()).unwrap().clone()).collect();
        opt.step(&vars.vars, &g, 1e-4, 1.0).unwrap();
        let t3 = Instant::now();
        if i > 0 {
            f = f.min((t1 - t0).as_secs_f64());
            b = b.min((t2 - t1).as_secs_f64());
            o = o.min((t3 - t2).as_secs_f64());
        }
    }
    println!("min: forward {:.1} ms, backward {:.1} ms, optimizer {:.1} ms", f * 1e3, b * 1e3, o * 1e3);
}
