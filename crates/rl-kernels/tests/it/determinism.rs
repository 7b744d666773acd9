//! The training kernels' reductions (norm weight gradients, attention dK / dV over query blocks)
//! give the same bits whatever the pool size up to eight threads and whatever the schedule: a
//! seeded training run is reproducible. Rayon's `fold` + `reduce_with` cut the work where its
//! threads happened to steal it, so the partial sums, and their rounding, changed between calls.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor, Var};
use rl_kernels::{AttnShape, RowLayout, ops};

use crate::{probe, rand};

/// Runs `f` on a fresh pool of `threads` threads.
fn on_pool<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap().install(f)
}

/// The gradients of `vars` under the scalar `loss`, as exact bit patterns.
fn grad_bits(vars: &[&Var], loss: &Tensor) -> Vec<Vec<u64>> {
    let grads = loss.backward().unwrap();
    vars.iter()
        .map(|v| {
            let g = grads.get(v.as_tensor()).expect("a gradient").to_dtype(DType::F64).unwrap();
            g.flatten_all().unwrap().to_vec1::<f64>().unwrap().into_iter().map(f64::to_bits).collect()
        })
        .collect()
}

/// `f`'s gradient bits on pools of 1, 2 and 3 threads (several calls on the larger ones) are equal.
fn same_bits_on_every_pool(what: &str, f: impl Fn() -> Vec<Vec<u64>> + Sync) {
    let want = on_pool(1, &f);
    for threads in [2, 3, 3, 2] {
        let got = on_pool(threads, &f);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let differ = g.iter().zip(w).filter(|(a, b)| a != b).count();
            assert_eq!(differ, 0, "{what}: gradient {i} differs in {differ} elements on {threads} threads");
        }
    }
}

fn var(shape: &[usize], seed: u64, scale: f64, dtype: DType) -> Var {
    Var::from_tensor(&rand(shape, seed, scale, dtype)).unwrap()
}

#[test]
fn norm_weight_gradients_have_the_same_bits_on_every_pool() {
    // 2,000 rows: dozens of row chunks, so a split pool sums partial gradients.
    let (x, w) = (var(&[2000, 64], 1, 2.0, DType::F32), var(&[64], 2, 1.0, DType::F32));
    same_bits_on_every_pool("rms_norm", || grad_bits(&[&x, &w], &probe(&ops::rms_norm(&x, &w, 1e-6).unwrap(), 3)));

    let rope = ops::Rope::new(16, 10_000.0, 4096, DType::F32, &Device::Cpu).unwrap();
    let positions: Arc<[u32]> = (0..2000u32).collect::<Vec<_>>().into();
    let w16 = var(&[16], 4, 1.0, DType::F32);
    same_bits_on_every_pool("head_norm_rope", || {
        grad_bits(&[&x, &w16], &probe(&ops::head_norm_rope(&x, &w16, 1e-6, positions.clone(), &rope).unwrap(), 5))
    });
}

#[test]
fn attention_key_and_value_gradients_have_the_same_bits_on_every_pool() {
    // Long rows and a shared prompt: many query blocks add into the same keys' gradients. f32 at a
    // head width of 16 runs the fused (flash) kernels, f64 the GEMM path.
    let layout = Arc::new(RowLayout::new(&[300, 500, 400, 600], &[None, Some(0), Some(0), None]).unwrap());
    let t = layout.len();
    for (dtype, d) in [(DType::F32, 16), (DType::F64, 8)] {
        let shape = AttnShape { q_heads: 4, kv_heads: 2, head_dim: d };
        let q = var(&[t, 4 * d], 10, 1.5, dtype);
        let k = var(&[t, 2 * d], 11, 1.5, dtype);
        let v = var(&[t, 2 * d], 12, 1.0, dtype);
        same_bits_on_every_pool(&format!("attention {dtype:?}"), || {
            let o = ops::attention(&q, &k, &v, layout.clone(), shape, 0.25).unwrap();
            grad_bits(&[&q, &k, &v], &probe(&o, 13))
        });
    }
}
