//! Optimizers with checkpointable state (candle's AdamW keeps its moments private): AdamW with
//! decoupled weight decay and bias correction, SGD with (Nesterov) momentum; global-norm clipping;
//! learning-rate schedules with warmup.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Tensor, Var};
use rl_configs::{OptimConfig, SchedulerConfig};

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

/// Scales gradients so their global L2 norm is at most `max_norm`; returns the norm before clipping.
pub fn clip_global_norm(grads: &mut [Tensor], max_norm: Option<f64>) -> Result<f64> {
    let mut sq = 0f64;
    for g in grads.iter() {
        sq += g.to_dtype(DType::F64)?.sqr()?.sum_all()?.to_scalar::<f64>()?;
    }
    let norm = sq.sqrt();
    if let Some(max) = max_norm
        && norm > max
    {
        let scale = max / (norm + 1e-6);
        for g in grads.iter_mut() {
            *g = (&*g * scale)?;
        }
    }
    Ok(norm)
}

/// An optimizer over named variables, with its state.
#[derive(Debug)]
pub struct Optimizer {
    cfg: OptimConfig,
    /// Updates applied so far.
    pub steps: u64,
    first: HashMap<String, Tensor>,
    second: HashMap<String, Tensor>,
}

impl Optimizer {
    /// A fresh optimizer.
    pub fn new(cfg: &OptimConfig) -> Self {
        Optimizer { cfg: cfg.clone(), steps: 0, first: HashMap::new(), second: HashMap::new() }
    }

    /// Applies one update with learning rate `lr`; `grads[i]` belongs to `vars[i]`.
    pub fn step(&mut self, vars: &[(String, Var)], grads: &[Tensor], lr: f64) -> Result<()> {
        self.steps += 1;
        let t = self.steps as i32;
        for ((name, var), g) in vars.iter().zip(grads) {
            let w = var.as_tensor();
            let zeros = || w.zeros_like();
            match self.cfg {
                OptimConfig::Adamw { weight_decay, betas: [b1, b2], eps, .. } => {
                    let m = self.first.get(name).map_or_else(zeros, |m| Ok(m.clone()))?;
                    let v = self.second.get(name).map_or_else(zeros, |v| Ok(v.clone()))?;
                    let m = ((m * b1)? + (g * (1.0 - b1))?)?;
                    let v = ((v * b2)? + (g.sqr()? * (1.0 - b2))?)?;
                    let m_hat = (&m / (1.0 - b1.powi(t)))?;
                    let v_hat = (&v / (1.0 - b2.powi(t)))?;
                    let update = (m_hat / (v_hat.sqrt()? + eps)?)?;
                    let decayed = (w * (1.0 - lr * weight_decay))?;
                    var.set(&(decayed - (update * lr)?)?)?;
                    self.first.insert(name.clone(), m);
                    self.second.insert(name.clone(), v);
                }
                OptimConfig::Sgd { momentum, nesterov, weight_decay, .. } => {
                    let g = if weight_decay > 0.0 { (g + (w * weight_decay)?)? } else { g.clone() };
                    let buf = match self.first.get(name) {
                        Some(b) => ((b * momentum)? + &g)?,
                        None => g.clone(),
                    };
                    let dir = if nesterov { (&g + (&buf * momentum)?)? } else { buf.clone() };
                    var.set(&(w - (dir * lr)?)?)?;
                    self.first.insert(name.clone(), buf);
                }
            }
        }
        Ok(())
    }

    /// Writes the state: `optimizer.safetensors` (moments) and `optimizer.json` (step count).
    pub fn save(&self, dir: &Path) -> Result<()> {
        let mut tensors: Vec<(String, Tensor)> = Vec::new();
        for (n, t) in &self.first {
            tensors.push((format!("first.{n}"), t.clone()));
        }
        for (n, t) in &self.second {
            tensors.push((format!("second.{n}"), t.clone()));
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
            for (name, t) in candle_core::safetensors::load(&file, device)? {
                if let Some(n) = name.strip_prefix("first.") {
                    opt.first.insert(n.to_owned(), t);
                } else if let Some(n) = name.strip_prefix("second.") {
                    opt.second.insert(n.to_owned(), t);
                }
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
    fn adamw_matches_the_formula_for_two_steps() {
        let cfg = OptimConfig::Adamw { lr: 0.1, weight_decay: 0.01, betas: [0.9, 0.999], eps: 1e-8, max_norm: 1.0 };
        let var = Var::new(&[1.0f64, -2.0], &Device::Cpu).unwrap();
        let vars = vec![(String::from("w"), var.clone())];
        let mut opt = Optimizer::new(&cfg);
        let (mut w, mut m, mut v) = ([1.0f64, -2.0], [0.0f64; 2], [0.0f64; 2]);
        for (t, g) in [[0.5f64, -1.0], [0.2, 0.3]].iter().enumerate() {
            opt.step(&vars, &[Tensor::new(g, &Device::Cpu).unwrap()], 0.1).unwrap();
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
    fn clipping_scales_to_the_max_norm() {
        let mut g = vec![Tensor::new(&[3.0f64, 4.0], &Device::Cpu).unwrap()];
        let norm = clip_global_norm(&mut g, Some(1.0)).unwrap();
        assert!((norm - 5.0).abs() < 1e-12);
        let v: Vec<f64> = g[0].to_vec1().unwrap();
        assert!((v[0] - 0.6).abs() < 1e-6 && (v[1] - 0.8).abs() < 1e-6);
        assert_eq!(clip_global_norm(&mut g, None).unwrap().round(), 1.0);
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
