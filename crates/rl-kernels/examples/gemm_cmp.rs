//! Scratch: packed kernel vs the gemm crate.
#![allow(clippy::print_stdout)]
use std::time::Instant;
use rl_kernels::cpu::packed::PackedLinear;
use rl_kernels::gemm::{MatMut, MatRef, matmul_par, matmul};
fn main() {
    rl_kernels::tune_process();
    for (m, k, n) in [(2048usize, 128usize, 384usize), (2048, 384, 128), (2048, 128, 256), (2048, 256, 768), (2048, 768, 256), (512, 128, 384), (32, 256, 768), (64,32,64)] {
        let x: Vec<f32> = (0..m * k).map(|i| (i % 13) as f32 * 0.1).collect();
        let w: Vec<f32> = (0..n * k).map(|i| (i % 7) as f32 * 0.1).collect();
        let mut y = vec![0f32; m * n];
        let reps = (2e9 / (2.0 * (m * k * n) as f64)).max(3.0) as usize;
        let p = PackedLinear::new(&w, n, k);
        p.apply(&mut y, &x, m, false);
        let t = Instant::now();
        for _ in 0..reps { p.apply(&mut y, &x, m, false); }
        let a = 2.0 * (m * k * n * reps) as f64 / t.elapsed().as_secs_f64() / 1e9;
        let t = Instant::now();
        for _ in 0..reps { let _ = PackedLinear::new(&w, n, k); }
        let pk = t.elapsed().as_secs_f64() / reps as f64 * 1e6;
        let t = Instant::now();
        for _ in 0..reps { matmul_par(MatMut::rows(&mut y, m, n, n), MatRef::rows(&x, m, k, k), MatRef::rows(&w, n, k, k).t(), 1.0, false); }
        let b = 2.0 * (m * k * n * reps) as f64 / t.elapsed().as_secs_f64() / 1e9;
        let t = Instant::now();
        for _ in 0..reps { matmul(MatMut::rows(&mut y, m, n, n), MatRef::rows(&x, m, k, k), MatRef::rows(&w, n, k, k).t(), 1.0, false); }
        let c = 2.0 * (m * k * n * reps) as f64 / t.elapsed().as_secs_f64() / 1e9;
        println!("m {m} k {k} n {n}: packed {a:.1} GF/s (pack {pk:.1} us)  gemm par {b:.1}  gemm 1t {c:.1}");
    }
}
