//! The in-place AdamW update equals the textbook formula.

use candle_core::{DType, Device, Tensor};
use rl_kernels::{AdamW, ops};

use crate::{max_abs_diff, rand};

#[test]
fn two_updates_equal_the_formula() {
    let w0 = rand(&[5, 7], 1, 1.0, DType::F64);
    let w = w0.copy().unwrap();
    let state = Tensor::zeros((2, 35), DType::F64, &Device::Cpu).unwrap();
    let (mut m, mut v) = (vec![0.0f64; 35], vec![0.0f64; 35]);
    let mut want: Vec<f64> = w0.flatten_all().unwrap().to_vec1().unwrap();
    for step in 1..=2u64 {
        let g = rand(&[5, 7], 10 + step, 1.0, DType::F64);
        let h = AdamW { lr: 0.01, beta1: 0.9, beta2: 0.99, eps: 1e-8, weight_decay: 0.1, step, grad_scale: 0.5 };
        ops::adamw_step(&w, &state, &g, &h).unwrap();
        let g: Vec<f64> = g.flatten_all().unwrap().to_vec1().unwrap();
        for i in 0..35 {
            let gi = g[i] * 0.5;
            m[i] = 0.9 * m[i] + 0.1 * gi;
            v[i] = 0.99 * v[i] + 0.01 * gi * gi;
            let (mh, vh) = (m[i] / (1.0 - 0.9f64.powi(step as i32)), v[i] / (1.0 - 0.99f64.powi(step as i32)));
            want[i] = want[i] * (1.0 - 0.01 * 0.1) - 0.01 * mh / (vh.sqrt() + 1e-8);
        }
    }
    let want = Tensor::from_vec(want, (5, 7), &Device::Cpu).unwrap();
    assert!(max_abs_diff(&w, &want) < 1e-14);
    let wrong = Tensor::zeros((2, 34), DType::F64, &Device::Cpu).unwrap();
    let h = AdamW { lr: 0.01, beta1: 0.9, beta2: 0.99, eps: 1e-8, weight_decay: 0.0, step: 1, grad_scale: 1.0 };
    assert!(ops::adamw_step(&w, &wrong, &w0, &h).is_err());
}
