//! Scratch: train-step time on a real batch, as packed and merged into longer rows.
#![allow(clippy::print_stdout)]
use candle_core::{Device, Tensor};
use rl_configs::{LossConfig, OptimConfig};
use rl_model::load_trainable;
use rl_trainer::{MicroBatch, Optimizer, micro_loss, read_batch, step_counts};
use std::path::Path;
use std::time::Instant;

fn merge(rows: &[MicroBatch], max: usize) -> Vec<MicroBatch> {
    let mut out: Vec<MicroBatch> = Vec::new();
    for r in rows {
        match out.last_mut() {
            Some(m) if m.input_ids.len() + r.input_ids.len() <= max => {
                let off = m.seq_lens.len() as i32;
                let (mp, rp) = (
                    if m.parents.is_empty() { vec![-1; m.seq_lens.len()] } else { m.parents.clone() },
                    if r.parents.is_empty() { vec![-1; r.seq_lens.len()] } else { r.parents.clone() },
                );
                m.parents = mp.into_iter().chain(rp.into_iter().map(|p| if p < 0 { -1 } else { p + off })).collect();
                m.input_ids.extend(&r.input_ids);
                m.position_ids.extend(&r.position_ids);
                m.seq_lens.extend(&r.seq_lens);
                m.loss_mask.extend(&r.loss_mask);
                m.advantages.extend(&r.advantages);
                m.inference_logprobs.extend(&r.inference_logprobs);
                m.temperatures.extend(&r.temperatures);
                m.env_index.extend(&r.env_index);
            }
            _ => out.push(r.clone()),
        }
    }
    out
}

fn main() {
    let run = Path::new("outputs/reverse-text-rl");
    let batch = read_batch(run, 40).unwrap();
    let (cfg, vars) = load_trainable(Path::new("outputs/reverse-text-sft/model"), &Device::Cpu).unwrap();
    let model = vars.model(&cfg, &Device::Cpu).unwrap();
    let scoped = std::env::var_os("SCOPED").is_some();
    for max in [256usize, 1024, 4096] {
        let rows = merge(&batch.micro_batches, max);
        let tokens: usize = rows.iter().map(|r| r.input_ids.len()).sum();
        let counts = step_counts(&rows).unwrap();
        let mut opt = Optimizer::new(&OptimConfig::default());
        let mut best = f64::MAX;
        for _ in 0..4 {
            let t = Instant::now();
            let work = || {
                let mut acc: Vec<Option<Tensor>> = vec![None; vars.vars.len()];
                for r in &rows {
                    let (l, _) = micro_loss(&model, r, &LossConfig::default(), counts).unwrap();
                    let g = l.backward().unwrap();
                    for (slot, (_, v)) in acc.iter_mut().zip(&vars.vars) {
                        if let Some(g) = g.get(v.as_tensor()) {
                            *slot = Some(match slot.take() {
                                Some(p) => (p + g).unwrap(),
                                None => g.clone(),
                            });
                        }
                    }
                }
                acc.into_iter().map(|g| g.unwrap()).collect::<Vec<_>>()
            };
            let grads = if scoped { rayon::scope(|_| work()) } else { work() };
            opt.step(&vars.vars, &grads, 1e-9, 1.0).unwrap();
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!(
            "rows <= {max}: {} rows, {tokens} tokens, best {:.3} s ({:.0} tok/s)",
            rows.len(),
            best,
            tokens as f64 / best
        );
    }
}
