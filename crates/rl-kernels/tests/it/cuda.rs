//! On a GPU (a `cuda` build, run on a machine with one): blocked attention with its CUDA softmax
//! kernels gives the fused CPU kernel's values and gradients, in f32 and in bf16.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor, Var};
use rl_kernels::ops::{self, composed};
use rl_kernels::{AttnShape, RowLayout};

use crate::rand;

/// Largest absolute difference over the largest absolute value of `reference`.
fn relative_error(reference: &Tensor, x: &Tensor) -> f64 {
    let to = |t: &Tensor| t.to_device(&Device::Cpu).unwrap().to_dtype(DType::F64).unwrap();
    let (r, x) = (to(reference), to(x));
    let max = |t: &Tensor| t.abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f64>().unwrap();
    max(&(&r - &x).unwrap()) / max(&r)
}

#[test]
fn blocked_attention_on_the_gpu_equals_the_fused_cpu_kernel() {
    let gpu = Device::new_cuda(0).expect("this test needs a CUDA GPU");
    // As the binaries open it (`rl_model::open_device`): no per-tensor events, freed memory kept.
    if let Device::Cuda(d) = &gpu {
        rl_kernels::single_stream_cuda(d);
        rl_kernels::keep_cuda_pool_memory(d);
    }
    let s = AttnShape { q_heads: 4, kv_heads: 2, head_dim: 64 };
    // Prefix-shared segments, rows of more keys than a kernel's 256 threads, in four query blocks.
    let layout = Arc::new(RowLayout::new(&[300, 120, 90, 200, 50], &[None, Some(0), Some(0), None, Some(3)]).unwrap());
    let t = layout.len();
    let (q, k, v) =
        (rand(&[t, 256], 1, 1.5, DType::F64), rand(&[t, 128], 2, 1.5, DType::F64), rand(&[t, 128], 3, 1.0, DType::F64));
    let w = rand(&[t, 256], 4, 1.0, DType::F64);
    let scale = 0.125;
    let vars = [&q, &k, &v].map(|x| Var::from_tensor(x).unwrap());
    let out = ops::attention(&vars[0], &vars[1], &vars[2], layout.clone(), s, scale).unwrap();
    let store = (&out * &w).unwrap().sum_all().unwrap().backward().unwrap();
    let grads = vars.each_ref().map(|x| store.get(x.as_tensor()).unwrap().clone());
    for (dtype, tol) in [(DType::F32, 1e-4), (DType::BF16, 4e-2)] {
        let on_gpu = |x: &Tensor| Var::from_tensor(&x.to_dtype(dtype).unwrap().to_device(&gpu).unwrap()).unwrap();
        let gvars = [&q, &k, &v].map(on_gpu);
        let block_scores = s.q_heads * t * 200;
        let gout =
            composed::attention_in_blocks(&gvars[0], &gvars[1], &gvars[2], &layout, s, scale, block_scores).unwrap();
        let err = relative_error(&out, &gout);
        assert!(err < tol, "{dtype:?} output differs by {err}");
        let gw = w.to_dtype(DType::F32).unwrap().to_device(&gpu).unwrap();
        let gstore = (gout.to_dtype(DType::F32).unwrap() * gw).unwrap().sum_all().unwrap().backward().unwrap();
        for (i, (gv, reference)) in gvars.iter().zip(&grads).enumerate() {
            let g = gstore.get(gv.as_tensor()).expect("a gradient");
            let err = relative_error(reference, g);
            assert!(err < tol, "{dtype:?} gradient of input {i} (q, k, v) differs by {err}");
        }
    }
}
