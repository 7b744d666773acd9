//! The fused attention equals a reference built from candle ops with an explicit mask from
//! `RowLayout::sees` (packed samples, a shared prompt, grouped heads, rows longer than one block),
//! and its gradients match finite differences.

use std::sync::Arc;

use candle_core::{D, DType, Device, Tensor, Var};
use rl_kernels::{AttnShape, RowLayout, ops};

use crate::{check_grads, max_abs_diff, probe, rand};

/// Reference: per head, softmax(q k^T * scale + mask) v, with repeated kv heads.
fn reference(q: &Tensor, k: &Tensor, v: &Tensor, layout: &RowLayout, s: AttnShape, scale: f64) -> Tensor {
    let t = layout.len();
    let mask: Vec<f64> = (0..t * t).map(|x| if layout.sees(x / t, x % t) { 0.0 } else { f64::NEG_INFINITY }).collect();
    let mask = Tensor::from_vec(mask, (t, t), &Device::Cpu).unwrap().to_dtype(q.dtype()).unwrap();
    let d = s.head_dim;
    let rep = s.q_heads / s.kv_heads;
    let mut outs = Vec::new();
    for h in 0..s.q_heads {
        let g = h / rep;
        let qh = q.narrow(1, h * d, d).unwrap();
        let kh = k.narrow(1, g * d, d).unwrap();
        let vh = v.narrow(1, g * d, d).unwrap();
        let scores = (qh.matmul(&kh.t().unwrap()).unwrap() * scale).unwrap().broadcast_add(&mask).unwrap();
        let p = candle_nn::ops::softmax(&scores, D::Minus1).unwrap();
        outs.push(p.matmul(&vh).unwrap());
    }
    Tensor::cat(&outs, 1).unwrap()
}

fn case(layout: RowLayout, s: AttnShape, dtype: DType, seed: u64) -> (Tensor, Tensor, Tensor, Arc<RowLayout>) {
    let t = layout.len();
    let q = rand(&[t, s.q_heads * s.head_dim], seed, 1.5, dtype);
    let k = rand(&[t, s.kv_heads * s.head_dim], seed + 1, 1.5, dtype);
    let v = rand(&[t, s.kv_heads * s.head_dim], seed + 2, 1.0, dtype);
    (q, k, v, Arc::new(layout))
}

#[test]
fn forward_equals_the_masked_reference() {
    let shape = AttnShape { q_heads: 4, kv_heads: 2, head_dim: 8 };
    let layouts = [
        RowLayout::packed(&[5, 9, 1, 3]),
        // A shared prompt with three completions, one longer than a block, plus an unrelated sample.
        RowLayout::new(&[7, 80, 3, 5, 6], &[None, Some(0), Some(0), Some(0), None]).unwrap(),
        // A two-level chain: prompt, first turn, two continuations of it.
        RowLayout::new(&[4, 3, 2, 70], &[None, Some(0), Some(1), Some(1)]).unwrap(),
        RowLayout::packed(&[150]),
    ];
    for (i, layout) in layouts.into_iter().enumerate() {
        let (q, k, v, layout) = case(layout, shape, DType::F32, 10 * i as u64);
        let fused = ops::attention(&q, &k, &v, layout.clone(), shape, 0.35).unwrap();
        let want = reference(&q, &k, &v, &layout, shape, 0.35);
        let err = max_abs_diff(&fused, &want);
        assert!(err < 2e-5, "layout {i}: max error {err}");
    }
}

#[test]
fn gradients_match_the_reference_and_finite_differences() {
    let shape = AttnShape { q_heads: 4, kv_heads: 2, head_dim: 4 };
    let layout = RowLayout::new(&[3, 4, 2, 3], &[None, Some(0), Some(0), None]).unwrap();
    let (q, k, v, layout) = case(layout, shape, DType::F64, 7);
    let (q, k, v) = (Var::from_tensor(&q).unwrap(), Var::from_tensor(&k).unwrap(), Var::from_tensor(&v).unwrap());
    let fused = || probe(&ops::attention(&q, &k, &v, layout.clone(), shape, 0.5).unwrap(), 99);
    let refr = || probe(&reference(&q, &k, &v, &layout, shape, 0.5), 99);
    let (gf, gr) = (fused().backward().unwrap(), refr().backward().unwrap());
    for x in [&q, &k, &v] {
        let err = max_abs_diff(gf.get(x.as_tensor()).unwrap(), gr.get(x.as_tensor()).unwrap());
        assert!(err < 1e-10, "gradient differs from the reference by {err}");
    }
    check_grads(&[q.clone(), k.clone(), v.clone()], fused);
}

#[test]
fn long_rows_are_blocked_and_still_exact() {
    // 200 tokens = 4 query blocks; gradients against the reference in f64.
    let shape = AttnShape { q_heads: 2, kv_heads: 1, head_dim: 4 };
    let layout = RowLayout::new(&[60, 140], &[None, Some(0)]).unwrap();
    let (q, k, v, layout) = case(layout, shape, DType::F64, 3);
    let (q, k, v) = (Var::from_tensor(&q).unwrap(), Var::from_tensor(&k).unwrap(), Var::from_tensor(&v).unwrap());
    let gf = probe(&ops::attention(&q, &k, &v, layout.clone(), shape, 0.5).unwrap(), 5).backward().unwrap();
    let gr = probe(&reference(&q, &k, &v, &layout, shape, 0.5), 5).backward().unwrap();
    for x in [&q, &k, &v] {
        let err = max_abs_diff(gf.get(x.as_tensor()).unwrap(), gr.get(x.as_tensor()).unwrap());
        assert!(err < 1e-10, "gradient differs from the reference by {err}");
    }
}

#[test]
fn the_fused_f32_kernel_matches_the_reference_forward_and_gradients() {
    // Head width 32 takes the fused kernel on SIMD widths of 8 and 16 (the GEMM path elsewhere):
    // a shared prompt, a continuation longer than a query block, grouped heads.
    let shape = AttnShape { q_heads: 4, kv_heads: 2, head_dim: 32 };
    let layout = RowLayout::new(&[40, 100, 7, 70], &[None, Some(0), Some(0), None]).unwrap();
    let (q, k, v, layout) = case(layout, shape, DType::F32, 21);
    let (q, k, v) = (Var::from_tensor(&q).unwrap(), Var::from_tensor(&k).unwrap(), Var::from_tensor(&v).unwrap());
    let scale = 1.0 / 32f64.sqrt();
    let fused = ops::attention(&q, &k, &v, layout.clone(), shape, scale).unwrap();
    let want = reference(&q, &k, &v, &layout, shape, scale);
    let err = max_abs_diff(&fused, &want);
    assert!(err < 2e-5, "output differs from the reference by {err}");
    let gf = probe(&fused, 8).backward().unwrap();
    let gr = probe(&want, 8).backward().unwrap();
    for x in [&q, &k, &v] {
        let (a, b) = (gf.get(x.as_tensor()).unwrap(), gr.get(x.as_tensor()).unwrap());
        let scale = b.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap() as f64;
        let err = max_abs_diff(a, b);
        assert!(err < 1e-4 * scale.max(1.0), "gradient differs from the reference by {err} (largest {scale})");
    }
}
