//! Optimizers with checkpointable state (candle's AdamW keeps its moments private): AdamW with
//! decoupled weight decay and bias correction, SGD with (Nesterov) momentum; global-norm clipping;
//! learning-rate schedules with warmup.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Tensor, Var};
use rl_configs::{OptimConfig, SchedulerConfig};
use rl_kernels::AdamW;

use crate::error::{Error, Result};

/// The learning rate after `step` completed optimizer steps (0-based index of the next update).
pub fn lr_at(sched: &SchedulerConfig, peak: f64, step: u64, max_steps: Option<u64>) -> f64 {
    let warm = |w: u64| if w > 0 && step < w { Some(peak * (step + 1) as f64 / w as f64) } else { None };
    match *sched {
        SchedulerConfig::Constant { warmup_steps } => warm(warmup_steps).unwrap_or(peak),
        SchedulerConfig::Linear { warmup_steps, decay_steps, min_lr } => {
            if let Some(lr) = warm(warmup_steps) {
                return lr;
            }
            let end = max_steps.unwrap_or(step + 1);
            let decay = decay_steps.unwrap_or(end.saturating_sub(warmup_steps)).max(1);
            let start = end.saturating_sub(decay);
            if step < start {
                peak
            } else {
                let frac = ((step - start) as f64 / decay as f64).min(1.0);
                peak + (min_lr - peak) * frac
            }
        }
        SchedulerConfig::Cosine { warmup_steps, min_lr } => {
            if let Some(lr) = warm(warmup_steps) {
                return lr;
            }
            let total = max_steps.unwrap_or(step + 1).saturating_sub(warmup_steps).max(1);
            let frac = ((step - warmup_steps) as f64 / total as f64).min(1.0);
            min_lr + (peak - min_lr) * 0.5 * (1.0 + (std::f64::consts::PI * frac).cos())
        }
    }
}

/// The global L2 norm of `grads`.
pub fn global_norm(grads: &[Tensor]) -> Result<f64> {
    let mut sq = 0f64;
    for g in grads {
        sq += rl_kernels::ops::sum_squares(g)?;
    }
    Ok(sq.sqrt())
}

/// The factor that brings a gradient of norm `norm` down to `max_norm` (1 when it is already within).
pub fn clip_factor(norm: f64, max_norm: Option<f64>) -> f64 {
    match max_norm {
        Some(max) if norm > max => max / (norm + 1e-6),
        _ => 1.0,
    }
}

/// An optimizer over named variables, with its state.
#[derive(Debug)]
pub struct Optimizer {
    cfg: OptimConfig,
    /// Updates applied so far.
    pub steps: u64,
    /// Per variable: AdamW's moments `[2, numel]` (m then v), or SGD's momentum buffer.
    state: HashMap<String, Tensor>,
    /// Per variable, its shape (the moments are saved in it).
    shapes: HashMap<String, candle_core::Shape>,
}

impl Optimizer {
    /// A fresh optimizer.
    pub fn new(cfg: &OptimConfig) -> Self {
        Optimizer { cfg: cfg.clone(), steps: 0, state: HashMap::new(), shapes: HashMap::new() }
    }

    /// Applies one update with learning rate `lr` to gradients scaled by `grad_scale` (clipping);
    /// `grads[i]` belongs to `vars[i]`.
    pub fn step(&mut self, vars: &[(String, Var)], grads: &[Tensor], lr: f64, grad_scale: f64) -> Result<()> {
        // Two small parallel passes per variable: keep the pool awake between them.
        rl_kernels::on_awake_pool(|| self.step_here(vars, grads, lr, grad_scale))
    }

    fn step_here(&mut self, vars: &[(String, Var)], grads: &[Tensor], lr: f64, grad_scale: f64) -> Result<()> {
        self.steps += 1;
        for ((name, var), g) in vars.iter().zip(grads) {
            let w = var.as_tensor();
            self.shapes.entry(name.clone()).or_insert_with(|| w.shape().clone());
            match self.cfg {
                OptimConfig::Adamw { weight_decay, betas: [b1, b2], eps, .. } => {
                    let state = match self.state.get(name) {
                        Some(s) => s.clone(),
                        None => {
                            let s = Tensor::zeros((2, w.elem_count()), w.dtype(), w.device())?;
                            self.state.insert(name.clone(), s.clone());
                            s
                        }
                    };
                    let h = AdamW { lr, beta1: b1, beta2: b2, eps, weight_decay, step: self.steps, grad_scale };
                    rl_kernels::ops::adamw_step(w, &state, g, &h)?;
                }
                OptimConfig::Sgd { momentum, nesterov, weight_decay, .. } => {
                    let g = (g * grad_scale)?;
                    let g = if weight_decay > 0.0 { (g + (w * weight_decay)?)? } else { g };
                    let buf = match self.state.get(name) {
                        Some(b) => ((b * momentum)? + &g)?,
                        None => g.clone(),
                    };
                    let dir = if nesterov { (&g + (&buf * momentum)?)? } else { buf.clone() };
                    var.set(&(w - (dir * lr)?)?)?;
                    self.state.insert(name.clone(), buf);
                }
            }
        }
        Ok(())
    }

    /// Regroups state saved per HF weight (before layers were one variable each) into the
    /// variables `groups` names: each group's parts, in order, become one flat state. A group with
    /// some parts' state but not all is an error naming the first missing one.
    pub fn regroup(&mut self, groups: &[(String, Vec<String>)]) -> Result<()> {
        for (flat, parts) in groups {
            if self.state.contains_key(flat) || !parts.iter().any(|p| self.state.contains_key(p)) {
                continue;
            }
            if let Some(missing) = parts.iter().find(|p| !self.state.contains_key(*p)) {
                return Err(Error::Checkpoint {
                    path: std::path::PathBuf::from(flat),
                    message: format!("the optimizer state has other weights of this layer but not {missing}"),
                });
            }
            let states: Vec<Tensor> = parts.iter().filter_map(|p| self.state.remove(p)).collect();
            for p in parts {
                self.shapes.remove(p);
            }
            // AdamW keeps [2, n] (m; v) per variable, SGD a buffer of the weight's shape.
            let joined = match self.cfg {
                OptimConfig::Adamw { .. } => Tensor::cat(&states, 1)?,
                OptimConfig::Sgd { .. } => {
                    Tensor::cat(&states.iter().map(Tensor::flatten_all).collect::<candle_core::Result<Vec<_>>>()?, 0)?
                }
            };
            let n = match self.cfg {
                OptimConfig::Adamw { .. } => joined.dim(1)?,
                OptimConfig::Sgd { .. } => joined.elem_count(),
            };
            self.shapes.insert(flat.clone(), candle_core::Shape::from(n));
            self.state.insert(flat.clone(), joined);
        }
        Ok(())
    }

    /// (first, second) moment tensors of a variable of `shape` (SGD: the momentum buffer, no second).
    fn moments(&self, state: &Tensor, shape: &candle_core::Shape) -> Result<(Tensor, Option<Tensor>)> {
        Ok(match self.cfg {
            OptimConfig::Adamw { .. } => (state.get(0)?.reshape(shape)?, Some(state.get(1)?.reshape(shape)?)),
            OptimConfig::Sgd { .. } => (state.clone(), None),
        })
    }

    /// Writes the state: `optimizer.safetensors` (moments) and `optimizer.json` (step count).
    pub fn save(&self, dir: &Path) -> Result<()> {
        let mut tensors: Vec<(String, Tensor)> = Vec::new();
        for (n, state) in &self.state {
            let shape = self.shapes.get(n).cloned().unwrap_or_else(|| state.shape().clone());
            let (first, second) = self.moments(state, &shape)?;
            tensors.push((format!("first.{n}"), first));
            if let Some(second) = second {
                tensors.push((format!("second.{n}"), second));
            }
        }
        if !tensors.is_empty() {
            rl_model::write_safetensors(&dir.join("optimizer.safetensors"), &tensors)?;
        }
        let meta = serde_json::json!({"steps": self.steps});
        std::fs::write(dir.join("optimizer.json"), meta.to_string())
            .map_err(|e| Error::io(dir.join("optimizer.json"), e))
    }

    /// Reads a state written by [`Optimizer::save`].
    pub fn load(cfg: &OptimConfig, dir: &Path, device: &candle_core::Device) -> Result<Self> {
        let meta_path = dir.join("optimizer.json");
        let text = std::fs::read_to_string(&meta_path).map_err(|e| Error::io(&meta_path, e))?;
        let meta: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::Checkpoint { path: dir.to_owned(), message: format!("optimizer.json: {e}") })?;
        let mut opt = Optimizer::new(cfg);
        opt.steps = meta["steps"].as_u64().unwrap_or(0);
        let file = dir.join("optimizer.safetensors");
        if file.exists() {
            let mut tensors = candle_core::safetensors::load(&file, device).map_err(|e| Error::Checkpoint {
                path: file.clone(),
                message: format!(
                    "cannot read the optimizer state (a damaged file? resume from an earlier checkpoint): {e}"
                ),
            })?;
            let names: Vec<String> =
                tensors.keys().filter_map(|k| k.strip_prefix("first.")).map(str::to_owned).collect();
            for n in names {
                let first = tensors.remove(&format!("first.{n}")).expect("listed above");
                let bad = |m: &str| Error::Checkpoint {
                    path: dir.to_owned(),
                    message: format!("optimizer state of {n}: {m}"),
                };
                opt.shapes.insert(n.clone(), first.shape().clone());
                let state = match (&opt.cfg, tensors.remove(&format!("second.{n}"))) {
                    (OptimConfig::Adamw { .. }, Some(second)) => {
                        if second.shape() != first.shape() {
                            return Err(bad("first and second moments differ in shape"));
                        }
                        Tensor::stack(&[first.flatten_all()?, second.flatten_all()?], 0)?
                    }
                    (OptimConfig::Adamw { .. }, None) => return Err(bad("the second moment is missing")),
                    (OptimConfig::Sgd { .. }, _) => first,
                };
                opt.state.insert(n, state);
            }
        }
        Ok(opt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn per_weight_state_of_older_checkpoints_is_regrouped_into_layer_variables() {
        let cfg = OptimConfig::Adamw { lr: 0.1, weight_decay: 0.0, betas: [0.9, 0.999], eps: 1e-8, max_norm: 1.0 };
        let mut opt = Optimizer::new(&cfg);
        let state = |v: &[f64]| Tensor::new(v, &Device::Cpu).unwrap().reshape((2, v.len() / 2)).unwrap();
        opt.state.insert(String::from("l.a"), state(&[1.0, 2.0, 10.0, 20.0]));
        opt.state.insert(String::from("l.b"), state(&[3.0, 30.0]));
        opt.state.insert(String::from("other"), state(&[5.0, 50.0]));
        opt.regroup(&[(String::from("l"), vec![String::from("l.a"), String::from("l.b")])]).unwrap();
        let flat = opt.state["l"].to_vec2::<f64>().unwrap();
        assert_eq!(flat, vec![vec![1.0, 2.0, 3.0], vec![10.0, 20.0, 30.0]], "m then v, parts in order");
        assert!(!opt.state.contains_key("l.a") && opt.state.contains_key("other"));
        // Half a layer's state is not silently dropped.
        let mut partial = Optimizer::new(&cfg);
        partial.state.insert(String::from("l.a"), state(&[1.0, 2.0]));
        let err = partial.regroup(&[(String::from("l"), vec![String::from("l.a"), String::from("l.b")])]).unwrap_err();
        assert!(err.to_string().contains("l.b"), "{err}");
    }

    #[test]
    fn adamw_matches_the_formula_for_two_steps() {
        let cfg = OptimConfig::Adamw { lr: 0.1, weight_decay: 0.01, betas: [0.9, 0.999], eps: 1e-8, max_norm: 1.0 };
        let var = Var::new(&[1.0f64, -2.0], &Device::Cpu).unwrap();
        let vars = vec![(String::from("w"), var.clone())];
        let mut opt = Optimizer::new(&cfg);
        let (mut w, mut m, mut v) = ([1.0f64, -2.0], [0.0f64; 2], [0.0f64; 2]);
        for (t, g) in [[0.5f64, -1.0], [0.2, 0.3]].iter().enumerate() {
            opt.step(&vars, &[Tensor::new(g, &Device::Cpu).unwrap()], 0.1, 1.0).unwrap();
            for k in 0..2 {
                m[k] = 0.9 * m[k] + 0.1 * g[k];
                v[k] = 0.999 * v[k] + 0.001 * g[k] * g[k];
                let mh = m[k] / (1.0 - 0.9f64.powi(t as i32 + 1));
                let vh = v[k] / (1.0 - 0.999f64.powi(t as i32 + 1));
                w[k] = w[k] * (1.0 - 0.1 * 0.01) - 0.1 * mh / (vh.sqrt() + 1e-8);
            }
        }
        let got: Vec<f64> = var.as_tensor().to_vec1().unwrap();
        for k in 0..2 {
            assert!((got[k] - w[k]).abs() < 1e-12, "{got:?} vs {w:?}");
        }
    }

    #[test]
    fn a_damaged_optimizer_file_is_named() {
        let cfg = OptimConfig::Adamw { lr: 0.1, weight_decay: 0.0, betas: [0.9, 0.999], eps: 1e-8, max_norm: 1.0 };
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("optimizer.json"), r#"{"steps": 3}"#).unwrap();
        std::fs::write(dir.path().join("optimizer.safetensors"), b"\x07\x00garbage").unwrap();
        let Err(err) = Optimizer::load(&cfg, dir.path(), &Device::Cpu) else { panic!("a damaged file is an error") };
        assert!(err.to_string().contains("optimizer.safetensors"), "{err}");
    }

    #[test]
    fn clipping_scales_to_the_max_norm() {
        let g = vec![Tensor::new(&[3.0f64, 4.0], &Device::Cpu).unwrap(), Tensor::new(&[0.0f32], &Device::Cpu).unwrap()];
        let norm = global_norm(&g).unwrap();
        assert!((norm - 5.0).abs() < 1e-12);
        assert!((clip_factor(norm, Some(1.0)) * 5.0 - 1.0).abs() < 1e-6);
        assert_eq!(clip_factor(norm, None), 1.0);
        assert_eq!(clip_factor(norm, Some(10.0)), 1.0);
    }

    #[test]
    fn saved_state_resumes_to_the_same_updates() {
        let cfg = OptimConfig::Adamw { lr: 0.1, weight_decay: 0.01, betas: [0.9, 0.999], eps: 1e-8, max_norm: 1.0 };

        let g = Tensor::new(&[[0.5f32, -1.0], [0.2, 0.3]], &Device::Cpu).unwrap();
        let a = vec![(String::from("w"), Var::new(&[[1.0f32, -2.0], [0.5, 3.0]], &Device::Cpu).unwrap())];
        let mut opt = Optimizer::new(&cfg);
        opt.step(&a, std::slice::from_ref(&g), 0.1, 1.0).unwrap();
        opt.step(&a, std::slice::from_ref(&g), 0.1, 1.0).unwrap();
        let dir = tempfile::tempdir().unwrap();
        opt.save(dir.path()).unwrap();
        let b = vec![(String::from("w"), Var::from_tensor(&a[0].1.as_tensor().copy().unwrap()).unwrap())];
        let mut loaded = Optimizer::load(&cfg, dir.path(), &Device::Cpu).unwrap();
        opt.step(&a, std::slice::from_ref(&g), 0.1, 0.5).unwrap();
        loaded.step(&b, std::slice::from_ref(&g), 0.1, 0.5).unwrap();
        let (wa, wb): (Vec<f32>, Vec<f32>) =
            (a[0].1.flatten_all().unwrap().to_vec1().unwrap(), b[0].1.flatten_all().unwrap().to_vec1().unwrap());
        assert_eq!(wa, wb, "a resumed optimizer continues exactly");
    }

    #[test]
    fn schedules_warm_up_then_decay() {
        let c = SchedulerConfig::Constant { warmup_steps: 4 };
        assert_eq!(lr_at(&c, 1.0, 0, None), 0.25);
        assert_eq!(lr_at(&c, 1.0, 3, None), 1.0);
        assert_eq!(lr_at(&c, 1.0, 9, None), 1.0);
        let cos = SchedulerConfig::Cosine { warmup_steps: 0, min_lr: 0.1 };
        assert!((lr_at(&cos, 1.0, 0, Some(10)) - 1.0).abs() < 1e-12);
        assert!((lr_at(&cos, 1.0, 5, Some(10)) - 0.55).abs() < 1e-12);
        assert!((lr_at(&cos, 1.0, 10, Some(10)) - 0.1).abs() < 1e-12);
        let lin = SchedulerConfig::Linear { warmup_steps: 2, decay_steps: Some(4), min_lr: 0.0 };
        assert_eq!(lr_at(&lin, 1.0, 3, Some(10)), 1.0, "constant until the decay starts");
        assert_eq!(lr_at(&lin, 1.0, 8, Some(10)), 0.5);
    }
}
