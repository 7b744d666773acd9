//! The composed ops (what CUDA and half precision run) equal the fused CPU kernels, forward and
//! backward, and work in bf16 with f32 master weights.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor, Var};
use rl_kernels::ops::{self, composed};
use rl_kernels::{AdamW, AttnShape, RowLayout, Targets};

use crate::{max_abs_diff, probe, rand};

fn var(t: &Tensor) -> Var {
    Var::from_tensor(t).unwrap()
}

/// Gradients of `f` with respect to `xs`, in order.
fn grads(xs: &[&Var], f: &Tensor) -> Vec<Tensor> {
    let g = f.backward().unwrap();
    xs.iter().map(|x| g.get(x.as_tensor()).expect("a gradient").clone()).collect()
}

fn assert_close(what: &str, a: &[Tensor], b: &[Tensor], tol: f64) {
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let err = max_abs_diff(x, y);
        assert!(err < tol, "{what}, tensor {i}: differs by {err}");
    }
}

#[test]
fn attention_over_shared_prefixes_equals_the_fused_kernel() {
    let s = AttnShape { q_heads: 4, kv_heads: 2, head_dim: 4 };
    let layout = Arc::new(RowLayout::new(&[5, 4, 3, 6, 2], &[None, Some(0), Some(0), None, Some(3)]).unwrap());
    let t = layout.len();
    let q = var(&rand(&[t, 16], 1, 1.5, DType::F64));
    let k = var(&rand(&[t, 8], 2, 1.5, DType::F64));
    let v = var(&rand(&[t, 8], 3, 1.0, DType::F64));
    let fused = probe(&ops::attention(&q, &k, &v, layout.clone(), s, 0.5).unwrap(), 4);
    let comp = probe(&composed::attention(&q, &k, &v, &layout, s, 0.5).unwrap(), 4);
    assert!((fused.to_scalar::<f64>().unwrap() - comp.to_scalar::<f64>().unwrap()).abs() < 1e-9);
    assert_close("attention grads", &grads(&[&q, &k, &v], &fused), &grads(&[&q, &k, &v], &comp), 1e-9);
    // In query blocks of 3 rows (4 heads x 20 keys x 3 = 240 scores): same values and gradients.
    let blocked = probe(&composed::attention_in_blocks(&q, &k, &v, &layout, s, 0.5, 240).unwrap(), 4);
    assert_close("blocked attention grads", &grads(&[&q, &k, &v], &fused), &grads(&[&q, &k, &v], &blocked), 1e-9);
}

#[test]
fn norms_swiglu_and_logprobs_equal_the_fused_kernels() {
    let (x, w) = (var(&rand(&[7, 12], 5, 2.0, DType::F64)), var(&rand(&[12], 6, 1.0, DType::F64)));
    let a = probe(&ops::rms_norm(&x, &w, 1e-6).unwrap(), 7);
    let b = probe(&composed::rms_norm(&x, &w, 1e-6).unwrap(), 7);
    assert_close("rms_norm grads", &grads(&[&x, &w], &a), &grads(&[&x, &w], &b), 1e-9);

    let rope = ops::Rope::new(4, 10_000.0, 32, DType::F64, &Device::Cpu).unwrap();
    let positions: Arc<[u32]> = vec![0, 1, 2, 3, 4, 3, 4].into();
    let w4 = var(&rand(&[4], 8, 1.0, DType::F64));
    let a = probe(&ops::head_norm_rope(&x, &w4, 1e-6, positions.clone(), &rope).unwrap(), 9);
    let b = probe(&composed::head_norm_rope(&x, &w4, 1e-6, &positions, &rope).unwrap(), 9);
    assert_close("head_norm_rope grads", &grads(&[&x, &w4], &a), &grads(&[&x, &w4], &b), 1e-9);
    let a = probe(&ops::rope(&x, 4, positions.clone(), &rope).unwrap(), 9);
    let b = probe(&composed::rope(&x, 4, &positions, &rope).unwrap(), 9);
    assert_close("rope grads", &grads(&[&x], &a), &grads(&[&x], &b), 1e-9);

    let u = var(&rand(&[7, 12], 10, 2.0, DType::F64));
    let a = probe(&ops::swiglu(&x, &u).unwrap(), 11);
    let b = probe(&composed::swiglu(&x, &u).unwrap(), 11);
    assert_close("swiglu grads", &grads(&[&x, &u], &a), &grads(&[&x, &u], &b), 1e-9);

    let targets = Targets { rows: vec![0, 2, 2, 6], ids: vec![3, 0, 11, 5], temps: vec![1.0, 0.7, 1.4, 2.0] };
    let a = ops::token_logprobs(&x, Arc::new(targets.clone())).unwrap();
    let b = composed::token_logprobs(&x, &targets).unwrap();
    assert!(max_abs_diff(&a, &b) < 1e-5, "logprobs and entropy (the composed path runs in f32)");
    let (pa, pb) = (probe(&a.narrow(1, 0, 1).unwrap(), 12), probe(&b.narrow(1, 0, 1).unwrap(), 12));
    assert_close("logprob grads", &grads(&[&x], &pa), &grads(&[&x], &pb), 1e-5);
}

#[test]
fn adamw_written_back_in_place_equals_the_fused_update() {
    let h = AdamW { lr: 1e-2, beta1: 0.9, beta2: 0.99, eps: 1e-8, weight_decay: 0.1, step: 3, grad_scale: 0.5 };
    let w0 = rand(&[6, 5], 13, 1.0, DType::F32);
    let s0 = (rand(&[2, 30], 14, 1.0, DType::F32).abs().unwrap() * 0.1).unwrap();
    let g = rand(&[6, 5], 15, 1.0, DType::F32);
    let (wa, sa) = (w0.copy().unwrap(), s0.copy().unwrap());
    ops::adamw_step(&wa, &sa, &g, &h).unwrap();
    let (wb, sb) = (w0.copy().unwrap(), s0.copy().unwrap());
    composed::adamw_step(&wb, &sb, &g, &h).unwrap();
    assert!(max_abs_diff(&wa, &wb) < 1e-6 && max_abs_diff(&sa, &sb) < 1e-6);
    assert!(max_abs_diff(&wa, &w0) > 1e-4, "the weight moved");
}

#[test]
fn bf16_compute_reaches_f32_master_weights() {
    // The GPU recipe: f32 variables, cast to bf16 for the forward pass, gradients back in f32.
    let s = AttnShape { q_heads: 2, kv_heads: 1, head_dim: 8 };
    let layout = Arc::new(RowLayout::packed(&[6, 5]));
    let x = rand(&[11, 16], 16, 1.0, DType::F32);
    let (wq, wk) = (var(&rand(&[16, 16], 17, 0.3, DType::F32)), var(&rand(&[8, 16], 18, 0.3, DType::F32)));
    let forward = |dtype: DType| {
        let xd = x.to_dtype(dtype).unwrap();
        let q = ops::linear(&xd, &wq.as_tensor().to_dtype(dtype).unwrap()).unwrap();
        let k = ops::linear(&xd, &wk.as_tensor().to_dtype(dtype).unwrap()).unwrap();
        let a = ops::attention(&q, &k, &k, layout.clone(), s, 0.35).unwrap();
        probe(&ops::rms_norm(&a, &Tensor::ones(16, dtype, &Device::Cpu).unwrap(), 1e-6).unwrap(), 19)
            .to_dtype(DType::F32)
            .unwrap()
    };
    let (full, half) = (forward(DType::F32), forward(DType::BF16));
    let (gf, gh) = (grads(&[&wq, &wk], &full), grads(&[&wq, &wk], &half));
    for (a, b) in gf.iter().zip(&gh) {
        assert_eq!(b.dtype(), DType::F32, "master gradients stay f32");
        let scale = a.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap() as f64;
        assert!(max_abs_diff(a, b) < 0.05 * scale, "bf16 gradients follow f32 ones");
    }
}
