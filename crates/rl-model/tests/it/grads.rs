//! Every trainable weight receives a gradient, and gradients match finite differences (f64).

use candle_core::{D, DType, Device, Tensor};
use rl_model::Trainable;

use crate::{family_configs, weights};

const IDS: [u32; 7] = [3, 17, 5, 30, 9, 22, 11];

/// Mean next-token cross-entropy over a packed row holding two samples.
fn loss(model: &rl_model::CausalLm) -> Tensor {
    let ids = vec![IDS.to_vec()];
    let pos = vec![vec![0, 1, 2, 3, 0, 1, 2]];
    let logits = model.forward_packed(&ids, &pos).unwrap().squeeze(0).unwrap();
    let logp = candle_nn::ops::log_softmax(&logits, D::Minus1).unwrap();
    // Targets: the next token within each sample (positions 0..2 and 4..5).
    let rows = Tensor::new(&[0u32, 1, 2, 4, 5], &Device::Cpu).unwrap();
    let targets = Tensor::new(&[17u32, 5, 30, 22, 11], &Device::Cpu).unwrap();
    let picked = logp.index_select(&rows, 0).unwrap().gather(&targets.unsqueeze(1).unwrap(), 1).unwrap();
    picked.mean_all().unwrap().neg().unwrap()
}

#[test]
fn every_weight_gets_a_nonzero_gradient() {
    for cfg in family_configs() {
        every_weight_gets_a_nonzero_gradient_in(&cfg);
    }
}

fn every_weight_gets_a_nonzero_gradient_in(cfg: &rl_model::ModelConfig) {
    let family = cfg.family;
    let cfg = cfg.clone();
    let t = Trainable::from_tensors(&cfg, &weights(&cfg, 1, DType::F32)).unwrap();
    let model = t.model(&cfg, &Device::Cpu).unwrap();
    let grads = loss(&model).backward().unwrap();
    assert_eq!(t.parts().len(), rl_model::weight_names(&cfg).len());
    for part in t.parts() {
        let name = &part.name;
        let var = &t.vars[part.var].1;
        let g = grads.get(var.as_tensor()).unwrap_or_else(|| panic!("{name} got no gradient"));
        let g = t.part_of(part, g).unwrap();
        assert_eq!(g.dims(), part.shape.as_slice(), "{name}");
        let norm = g.abs().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(norm > 0.0 && norm.is_finite(), "{family:?} {name}: gradient norm {norm}");
    }
}

#[test]
fn gradients_match_finite_differences_in_f64() {
    for cfg in family_configs() {
        gradients_match_finite_differences_in(&cfg);
    }
}

fn gradients_match_finite_differences_in(cfg: &rl_model::ModelConfig) {
    let (family, cfg) = (cfg.family, cfg.clone());
    let t = Trainable::from_tensors(&cfg, &weights(&cfg, 2, DType::F64)).unwrap();
    let model = t.model(&cfg, &Device::Cpu).unwrap();
    let grads = loss(&model).backward().unwrap();
    let eps = 1e-6;
    for part in t.parts() {
        let (name, var) = (&part.name, &t.vars[part.var].1);
        let analytic = grads.get(var.as_tensor()).unwrap().flatten_all().unwrap().to_vec1::<f64>().unwrap();
        let base = var.as_tensor().flatten_all().unwrap().to_vec1::<f64>().unwrap();
        let shape = var.as_tensor().shape().clone();
        // Two elements per weight: the one with the largest gradient and a fixed middle one.
        let len: usize = part.shape.iter().product();
        let own = &analytic[part.offset..part.offset + len];
        let largest = part.offset + own.iter().enumerate().max_by(|a, b| a.1.abs().total_cmp(&b.1.abs())).unwrap().0;
        for idx in [largest, part.offset + len / 2] {
            let eval = |delta: f64| {
                let mut v = base.clone();
                v[idx] += delta;
                var.set(&Tensor::from_vec(v, shape.clone(), &Device::Cpu).unwrap()).unwrap();
                loss(&model).to_scalar::<f64>().unwrap()
            };
            let numeric = (eval(eps) - eval(-eps)) / (2.0 * eps);
            var.set(&Tensor::from_vec(base.clone(), shape.clone(), &Device::Cpu).unwrap()).unwrap();
            let a = analytic[idx];
            assert!(
                (numeric - a).abs() <= 1e-6 + 1e-4 * a.abs(),
                "{family:?} {name}[{idx}]: analytic {a}, numeric {numeric}"
            );
        }
    }
}
