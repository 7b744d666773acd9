//! Benchmark: the packed products of a decode step at the Qwen3-0.6B shape (28 layers of q/k/v,
//! o, gate/up and down, distinct weights so that they stream from memory as in a real step), at
//! 1, 4 and 8 rows, in f32 and bf16: milliseconds a step (the best of 8), the weight bytes read a
//! second and the arithmetic rate. For kernel work between full decode benchmarks (`cargo xtask
//! bench train-0.6b`): `cargo bench -p rl-kernels --bench packed [-- f32|bf16] [rows...]`.

// The printed lines are this benchmark's output.
#![allow(clippy::print_stdout)]

use std::time::Instant;

use rl_kernels::cpu::packed::PackedLinear;

/// (out, in) of one layer's packed products: q/k/v stacked, o, gate/up stacked, down.
const LAYER: [(usize, usize); 4] = [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072)];
const LAYERS: usize = 28;

/// The allocator `rl` runs with.
#[global_allocator]
static ALLOC: rl_kernels::LargeBlockCache = rl_kernels::LargeBlockCache::new();

fn main() {
    rl_kernels::tune_process();
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let rows: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let rows = if rows.is_empty() { vec![1, 4, 8] } else { rows };
    let dtypes: Vec<&str> = ["f32", "bf16"].into_iter().filter(|d| args.iter().any(|a| a == d)).collect();
    for dtype in if dtypes.is_empty() { vec!["f32", "bf16"] } else { dtypes } {
        let weights: Vec<PackedLinear> = (0..LAYERS)
            .flat_map(|l| LAYER.iter().map(move |&s| (l, s)))
            .map(|(l, (out, inp))| {
                let w: Vec<f32> = (0..out * inp).map(|i| ((i * 37 + l * 11) % 101) as f32 / 101.0 - 0.5).collect();
                if dtype == "bf16" { PackedLinear::new_bf16(&w, out, inp) } else { PackedLinear::new(&w, out, inp) }
            })
            .collect();
        let params: usize = weights.iter().map(|w| w.out() * w.inp()).sum();
        let bytes = params * if dtype == "bf16" { 2 } else { 4 };
        let widest = LAYER.iter().map(|&(o, i)| o.max(i)).max().unwrap_or(0);
        for &m in &rows {
            let x: Vec<f32> = (0..m * widest).map(|i| (i % 13) as f32 / 13.0).collect();
            let mut y = vec![0f32; m * widest];
            let mut step = || {
                let start = Instant::now();
                rl_kernels::on_awake_pool(|| {
                    for w in &weights {
                        w.apply(&mut y[..m * w.out()], &x[..m * w.inp()], m, false);
                    }
                });
                start.elapsed().as_secs_f64()
            };
            step();
            let best = (0..8).map(|_| step()).fold(f64::MAX, f64::min);
            println!(
                "{dtype} rows {m}: {:.1} ms a step, {:.1} GB/s of weights, {:.1} GFLOP/s",
                best * 1e3,
                bytes as f64 / best / 1e9,
                (2 * m * params) as f64 / best / 1e9
            );
        }
    }
}
