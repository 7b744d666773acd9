//! RMSNorm, head norm + RoPE, SwiGLU and the temperature log-probabilities equal their unfused
//! references and their gradients match finite differences.

use std::sync::Arc;

use candle_core::{D, DType, Device, Tensor, Var};
use rl_kernels::{Targets, ops};

use crate::{check_grads, max_abs_diff, probe, rand};

fn ref_rms(x: &Tensor, w: &Tensor, eps: f64) -> Tensor {
    let var = x.sqr().unwrap().mean_keepdim(D::Minus1).unwrap();
    x.broadcast_div(&(var + eps).unwrap().sqrt().unwrap()).unwrap().broadcast_mul(w).unwrap()
}

#[allow(clippy::needless_pass_by_value)] // reads as `var(rand(..))`
fn var(t: Tensor) -> Var {
    Var::from_tensor(&t).unwrap()
}

#[test]
fn rms_norm_equals_the_reference_with_gradients() {
    let x = rand(&[37, 24], 1, 2.0, DType::F32);
    let w = rand(&[24], 2, 1.0, DType::F32);
    assert!(max_abs_diff(&ops::rms_norm(&x, &w, 1e-6).unwrap(), &ref_rms(&x, &w, 1e-6)) < 1e-5);
    let (x, w) = (var(rand(&[5, 3, 8], 3, 2.0, DType::F64)), var(rand(&[8], 4, 1.0, DType::F64)));
    check_grads(&[x.clone(), w.clone()], || probe(&ops::rms_norm(&x, &w, 1e-6).unwrap(), 5));
}

/// Reference rotate-half RoPE of `[T, H*d]` after a per-head RMSNorm.
fn ref_head_norm_rope(x: &Tensor, w: &Tensor, positions: &[u32], rope: &ops::Rope, heads: usize, d: usize) -> Tensor {
    let t = positions.len();
    let (cos, sin) = rope_tables(rope, positions, d);
    let xh = ref_rms(&x.reshape((t, heads, d)).unwrap(), w, 1e-6);
    let (x1, x2) = (xh.narrow(2, 0, d / 2).unwrap(), xh.narrow(2, d / 2, d / 2).unwrap());
    let r1 = (x1.broadcast_mul(&cos).unwrap() - x2.broadcast_mul(&sin).unwrap()).unwrap();
    let r2 = (x2.broadcast_mul(&cos).unwrap() + x1.broadcast_mul(&sin).unwrap()).unwrap();
    Tensor::cat(&[r1, r2], 2).unwrap().reshape((t, heads * d)).unwrap()
}

fn rope_tables(rope: &ops::Rope, positions: &[u32], d: usize) -> (Tensor, Tensor) {
    let full = |which: usize| {
        let (cos, sin) = rope.tables();
        let table = if which == 0 { cos } else { sin };
        let idx = Tensor::new(positions, &Device::Cpu).unwrap();
        table.index_select(&idx, 0).unwrap().reshape((positions.len(), 1, d / 2)).unwrap()
    };
    (full(0), full(1))
}

#[test]
fn head_norm_rope_equals_the_reference_with_gradients() {
    let (heads, d) = (3, 8);
    let positions: Arc<[u32]> = vec![0, 1, 2, 3, 4, 2, 3, 9].into();
    for dtype in [DType::F32, DType::F64] {
        let rope = ops::Rope::new(d, 10_000.0, 16, dtype, &Device::Cpu).unwrap();
        let x = rand(&[positions.len(), heads * d], 6, 2.0, dtype);
        let w = rand(&[d], 7, 1.0, dtype);
        let fused = ops::head_norm_rope(&x, &w, 1e-6, positions.clone(), &rope).unwrap();
        let err = max_abs_diff(&fused, &ref_head_norm_rope(&x, &w, &positions, &rope, heads, d));
        assert!(err < 1e-5, "{dtype:?}: {err}");
    }
    let rope = ops::Rope::new(d, 10_000.0, 16, DType::F64, &Device::Cpu).unwrap();
    let (x, w) = (var(rand(&[positions.len(), heads * d], 8, 2.0, DType::F64)), var(rand(&[d], 9, 1.0, DType::F64)));
    check_grads(&[x.clone(), w.clone()], || {
        probe(&ops::head_norm_rope(&x, &w, 1e-6, positions.clone(), &rope).unwrap(), 10)
    });
    let beyond: Arc<[u32]> = vec![16].into();
    let x = rand(&[1, heads * d], 1, 1.0, DType::F64);
    let err = ops::head_norm_rope(&x, &w, 1e-6, beyond, &rope).unwrap_err();
    assert!(err.to_string().contains("beyond the rotary tables"), "{err}");
}

#[test]
fn rope_alone_equals_the_reference_with_gradients() {
    let (heads, d) = (3, 8);
    let positions: Arc<[u32]> = vec![0, 1, 2, 3, 4, 2, 3, 9].into();
    // Scaled frequencies (as a Llama 3 rope scaling makes them), not only theta^(-2i/d).
    let inv = [1.0, 0.31, 0.05, 0.0007];
    for dtype in [DType::F32, DType::F64] {
        let rope = ops::Rope::from_inv_freq(&inv, 16, dtype, &Device::Cpu).unwrap();
        let x = rand(&[positions.len(), heads * d], 6, 2.0, dtype);
        let (cos, sin) = rope_tables(&rope, &positions, d);
        let xh = x.reshape((positions.len(), heads, d)).unwrap();
        let (x1, x2) = (xh.narrow(2, 0, d / 2).unwrap(), xh.narrow(2, d / 2, d / 2).unwrap());
        let r1 = (x1.broadcast_mul(&cos).unwrap() - x2.broadcast_mul(&sin).unwrap()).unwrap();
        let r2 = (x2.broadcast_mul(&cos).unwrap() + x1.broadcast_mul(&sin).unwrap()).unwrap();
        let want = Tensor::cat(&[r1, r2], 2).unwrap().reshape((positions.len(), heads * d)).unwrap();
        let err = max_abs_diff(&ops::rope(&x, d, positions.clone(), &rope).unwrap(), &want);
        assert!(err < 1e-6, "{dtype:?}: {err}");
    }
    let rope = ops::Rope::from_inv_freq(&inv, 16, DType::F64, &Device::Cpu).unwrap();
    let x = var(rand(&[positions.len(), heads * d], 8, 2.0, DType::F64));
    check_grads(std::slice::from_ref(&x), || probe(&ops::rope(&x, d, positions.clone(), &rope).unwrap(), 10));
    let x = rand(&[1, heads * d], 1, 1.0, DType::F64);
    let err = ops::rope(&x, d, vec![16].into(), &rope).unwrap_err();
    assert!(err.to_string().contains("beyond the rotary tables"), "{err}");
    let err = ops::rope(&x, 4, vec![0].into(), &rope).unwrap_err();
    assert!(err.to_string().contains("not for head_dim 4"), "{err}");
}

#[test]
fn swiglu_equals_the_reference_with_gradients() {
    let (g, u) = (rand(&[9, 13], 11, 4.0, DType::F32), rand(&[9, 13], 12, 2.0, DType::F32));
    let want = (g.silu().unwrap() * &u).unwrap();
    assert!(max_abs_diff(&ops::swiglu(&g, &u).unwrap(), &want) < 1e-6);
    let (g, u) = (var(rand(&[4, 6], 13, 4.0, DType::F64)), var(rand(&[4, 6], 14, 2.0, DType::F64)));
    check_grads(&[g.clone(), u.clone()], || probe(&ops::swiglu(&g, &u).unwrap(), 15));
}

#[test]
fn logprobs_and_entropy_equal_the_reference_with_gradients() {
    let (rows, vocab) = (6, 11);
    // Row 2 predicts three targets at different temperatures (a shared prompt's last token).
    let targets = Arc::new(Targets {
        rows: vec![0, 2, 2, 2, 3, 5],
        ids: vec![4, 0, 10, 3, 7, 7],
        temps: vec![1.0, 0.7, 1.3, 2.0, 1.0, 0.5],
    });
    let z = rand(&[rows, vocab], 21, 3.0, DType::F64);
    let out = ops::token_logprobs(&z, targets.clone()).unwrap();
    for n in 0..targets.len() {
        let row = z.get(targets.rows[n] as usize).unwrap();
        let scaled = (row / f64::from(targets.temps[n])).unwrap();
        let logp = candle_nn::ops::log_softmax(&scaled, D::Minus1).unwrap();
        let lp = logp.get(targets.ids[n] as usize).unwrap().to_scalar::<f64>().unwrap();
        let ent = (logp.exp().unwrap() * &logp).unwrap().sum_all().unwrap().neg().unwrap().to_scalar::<f64>().unwrap();
        let got: Vec<f64> = out.get(n).unwrap().to_vec1().unwrap();
        assert!((got[0] - lp).abs() < 1e-12 && (got[1] - ent).abs() < 1e-12, "target {n}: {got:?} vs {lp}, {ent}");
    }
    let z = var(z);
    check_grads(std::slice::from_ref(&z), || {
        probe(&ops::token_logprobs(&z, targets.clone()).unwrap().narrow(1, 0, 1).unwrap(), 22)
    });
    let bad = Arc::new(Targets { rows: vec![6], ids: vec![0], temps: vec![1.0] });
    assert!(ops::token_logprobs(&z, bad).unwrap_err().to_string().contains("outside 6 rows"));
    let zero_t = Arc::new(Targets { rows: vec![0], ids: vec![0], temps: vec![0.0] });
    assert!(ops::token_logprobs(&z, zero_t).unwrap_err().to_string().contains("not positive"));
}

#[test]
fn linear_equals_the_matmul_with_gradients() {
    let (x, w) = (rand(&[2, 5, 7], 31, 1.0, DType::F32), rand(&[4, 7], 32, 1.0, DType::F32));
    let want = x.broadcast_matmul(&w.t().unwrap()).unwrap();
    assert!(max_abs_diff(&ops::linear(&x, &w).unwrap(), &want) < 1e-5);
    let (x, w) = (var(rand(&[5, 7], 33, 1.0, DType::F64)), var(rand(&[4, 7], 34, 1.0, DType::F64)));
    check_grads(&[x.clone(), w.clone()], || probe(&ops::linear(&x, &w).unwrap(), 35));
    assert!(ops::linear(&x, &rand(&[4, 6], 1, 1.0, DType::F64)).is_err(), "mismatched inner dimension");
}
