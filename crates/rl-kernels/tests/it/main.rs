//! Integration tests of the fused ops: each equals its unfused reference (candle's differentiable
//! ops) and its gradients match finite differences in f64.

mod adamw;
mod attention;
mod composed;
#[cfg(feature = "cuda")]
mod cuda;
mod determinism;
mod layer;
mod pointwise;

use candle_core::{DType, Device, Tensor, Var};

/// A deterministic pseudo-random tensor in [-scale, scale].
pub(crate) fn rand(shape: &[usize], seed: u64, scale: f64, dtype: DType) -> Tensor {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(1);
    let data: Vec<f64> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * scale
        })
        .collect();
    Tensor::from_vec(data, shape, &Device::Cpu).unwrap().to_dtype(dtype).unwrap()
}

pub(crate) fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    let d = (a.to_dtype(DType::F64).unwrap() - b.to_dtype(DType::F64).unwrap()).unwrap();
    d.abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f64>().unwrap()
}

/// Checks the analytic gradients of `f` (a scalar function of `vars`) against central differences
/// at a few elements of each input (f64).
pub(crate) fn check_grads(vars: &[Var], f: impl Fn() -> Tensor) {
    let grads = f().backward().unwrap();
    for (vi, var) in vars.iter().enumerate() {
        let analytic = grads.get(var.as_tensor()).unwrap_or_else(|| panic!("input {vi} got no gradient"));
        let analytic: Vec<f64> = analytic.flatten_all().unwrap().to_vec1().unwrap();
        let base: Vec<f64> = var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        let shape = var.as_tensor().shape().clone();
        let n = base.len();
        let largest = analytic.iter().enumerate().max_by(|a, b| a.1.abs().total_cmp(&b.1.abs())).unwrap().0;
        assert!(analytic[largest].abs() > 0.0, "input {vi}: all-zero gradient");
        for idx in [largest, 0, n / 3, n / 2, n - 1] {
            let eval = |delta: f64| {
                let mut v = base.clone();
                v[idx] += delta;
                var.set(&Tensor::from_vec(v, shape.clone(), &Device::Cpu).unwrap()).unwrap();
                f().to_scalar::<f64>().unwrap()
            };
            let eps = 1e-6;
            let numeric = (eval(eps) - eval(-eps)) / (2.0 * eps);
            var.set(&Tensor::from_vec(base.clone(), shape.clone(), &Device::Cpu).unwrap()).unwrap();
            let a = analytic[idx];
            assert!((numeric - a).abs() <= 1e-7 + 1e-5 * a.abs(), "input {vi}[{idx}]: analytic {a}, numeric {numeric}");
        }
    }
}

/// `sum(x * r)` for a fixed random `r`: a scalar whose gradient reaches every output element.
pub(crate) fn probe(x: &Tensor, seed: u64) -> Tensor {
    let r = rand(x.dims(), seed, 1.0, x.dtype());
    (x * r).unwrap().sum_all().unwrap()
}
