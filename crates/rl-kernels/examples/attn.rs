//! Scratch: attention kernel time on training shapes.
#![allow(clippy::print_stdout)]
use rl_kernels::cpu::attention::{backward, forward};
use rl_kernels::{AttnShape, RowLayout};
fn main() {
    let shape = AttnShape { q_heads: 8, kv_heads: 4, head_dim: 32 };
    let layout = RowLayout::packed(&[512, 512, 512, 512]);
    let t = 2048;
    let q: Vec<f32> = (0..t * 256).map(|i| ((i % 13) as f32 - 6.0) * 0.1).collect();
    let k: Vec<f32> = (0..t * 128).map(|i| ((i % 11) as f32 - 5.0) * 0.1).collect();
    let v = k.clone();
    let (o, lse) = forward(&layout, shape, &q, &k, &v, 0.17);
    let t0 = std::time::Instant::now();
    for _ in 0..5 {
        let _ = forward(&layout, shape, &q, &k, &v, 0.17);
    }
    let t1 = std::time::Instant::now();
    for _ in 0..5 {
        let _ = backward(&layout, shape, &q, &k, &v, &o, &lse, &o, 0.17);
    }
    let t2 = std::time::Instant::now();
    println!("forward {:.1} ms, backward {:.1} ms", (t1 - t0).as_secs_f64() * 200.0, (t2 - t1).as_secs_f64() * 200.0);
}
