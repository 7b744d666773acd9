//! LoRA adapters in PEFT's format: their names and shapes, PEFT's initialisation, the adapter
//! directory (`adapter_config.json` + `adapter_model.safetensors`) written and read, and merging
//! an adapter into base weights (`W + alpha / r * B A`). The one owner of the adapter layout: the
//! fused layer's flat order ([`rl_kernels::LoraShape::parts`]) and PEFT's names meet here.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use rl_configs::LoraConfig;
use rl_kernels::{LoraShape, Proj};
use rl_run::{persist, temp_path};
use serde_json::json;

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::layout::{layer_shape, module_path};
use crate::rng::SplitMix64;

/// The adapter directory's config file (PEFT's name).
pub const ADAPTER_CONFIG: &str = "adapter_config.json";
/// The adapter directory's weights file (PEFT's name).
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";

/// What an adapter is: rank, scale and targets (from a config, or read back from a directory),
/// and the dropout it trains with.
#[derive(Debug, Clone, PartialEq)]
pub struct Lora {
    /// Rank, `alpha / r` and targets, as the fused layer takes them.
    pub shape: LoraShape,
    /// `lora_alpha`.
    pub alpha: f64,
    /// `lora_dropout`: the probability of zeroing an adapter input element in a training pass.
    pub dropout: f64,
}

impl Lora {
    /// The adapters a config asks for.
    pub fn from_config(c: &LoraConfig) -> Lora {
        let mut targets = [false; 7];
        for m in &c.target_modules {
            if let Some(p) = Proj::from_module(m) {
                targets[p as usize] = true;
            }
        }
        let shape = LoraShape { rank: c.rank as usize, scale: c.scale(), targets };
        Lora { shape, alpha: c.alpha, dropout: c.dropout }
    }

    /// Whether `other` has the same adapters (rank, alpha, targets): what a checkpoint must match
    /// to resume. The dropout is how they train, not what they are.
    pub fn same_adapters(&self, other: &Lora) -> bool {
        self.shape == other.shape && self.alpha == other.alpha
    }

    /// The targeted projections, in the flat order.
    pub fn targets(&self) -> Vec<Proj> {
        Proj::ALL.into_iter().filter(|&p| self.shape.targets(p)).collect()
    }
}

/// PEFT's name of an adapter matrix (`base_model.model.<module>.lora_A.weight`).
pub fn adapter_name(i: usize, p: Proj, which: char) -> String {
    format!("base_model.model.{}.lora_{which}.weight", module_path(i, p))
}

/// Layer `i`'s adapter matrices (PEFT name, shape) in the fused layer's flat order: A `[r, in]`
/// then B `[out, r]` of each targeted projection.
pub fn adapter_shapes(cfg: &ModelConfig, lora: &Lora, i: usize) -> Vec<(String, Vec<usize>)> {
    let r = lora.shape.rank;
    lora.shape
        .parts(&layer_shape(cfg))
        .into_iter()
        .flat_map(|p| [(adapter_name(i, p.proj, 'A'), vec![r, p.inp]), (adapter_name(i, p.proj, 'B'), vec![p.out, r])])
        .collect()
}

/// Fresh adapters as PEFT initialises them: `A` Kaiming-uniform with `a = sqrt(5)` (uniform in
/// `±1/sqrt(in)`), `B` zero, so the adapted model starts equal to the base.
pub fn init_adapters(cfg: &ModelConfig, lora: &Lora, seed: u64, device: &Device) -> Result<HashMap<String, Tensor>> {
    let mut rng = SplitMix64::new(seed ^ 0x4c6f_5241);
    let mut out = HashMap::new();
    for i in 0..cfg.num_hidden_layers {
        for (name, shape) in adapter_shapes(cfg, lora, i) {
            let n: usize = shape.iter().product();
            let t = if name.contains(".lora_A.") {
                let bound = 1.0 / (shape[1] as f64).sqrt();
                let v: Vec<f32> = (0..n).map(|_| ((rng.uniform() * 2.0 - 1.0) * bound) as f32).collect();
                Tensor::from_vec(v, shape.as_slice(), device)?
            } else {
                Tensor::zeros(shape.as_slice(), DType::F32, device)?
            };
            out.insert(name, t);
        }
    }
    Ok(out)
}

/// Checks that `tensors` hold exactly the adapters `lora` describes for `cfg` (names and shapes).
pub fn check_adapters(cfg: &ModelConfig, lora: &Lora, tensors: &HashMap<String, Tensor>, dir: &Path) -> Result<()> {
    let mut expected = 0;
    for i in 0..cfg.num_hidden_layers {
        for (name, shape) in adapter_shapes(cfg, lora, i) {
            expected += 1;
            let t = tensors.get(&name).ok_or_else(|| Error::bad_dir(dir, format!("the adapter has no {name}")))?;
            if t.dims() != shape.as_slice() {
                return Err(Error::bad_dir(dir, format!("adapter {name} is {:?}, expected {shape:?}", t.dims())));
            }
        }
    }
    if tensors.len() != expected {
        let extra = tensors.keys().find(|k| !k.contains(".lora_A.") && !k.contains(".lora_B.")).cloned();
        return Err(Error::bad_dir(
            dir,
            format!("the adapter holds {} tensors, expected {expected} (e.g. {extra:?} is not one)", tensors.len()),
        ));
    }
    Ok(())
}

/// Writes an adapter directory PEFT loads (`PeftModel.from_pretrained(base, dir)`): built in a
/// sibling temp directory, then renamed. `base` names the base model in `adapter_config.json`.
pub fn write_adapter_dir(out: &Path, lora: &Lora, base: &str, tensors: &[(String, Tensor)]) -> Result<()> {
    let tmp = temp_path(out);
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    let result = (|| {
        write_adapter_files(&tmp, lora, base, tensors)?;
        if out.exists() {
            std::fs::remove_dir_all(out).map_err(|e| Error::io(out, e))?;
        }
        Ok(persist(&tmp, out)?)
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result
}

/// Writes `adapter_config.json` and `adapter_model.safetensors` into the existing `dir`, each
/// atomically.
pub fn write_adapter_files(dir: &Path, lora: &Lora, base: &str, tensors: &[(String, Tensor)]) -> Result<()> {
    let modules: Vec<&str> = lora.targets().into_iter().map(Proj::module).collect();
    let config = json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": lora.shape.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "target_modules": modules,
        "bias": "none",
        "fan_in_fan_out": false,
        "use_rslora": false,
        "init_lora_weights": true,
        "inference_mode": true,
    });
    let text = serde_json::to_string_pretty(&config).expect("json values serialize");
    rl_run::write_atomic(&dir.join(ADAPTER_CONFIG), text.as_bytes())?;
    crate::tensor_file::write_safetensors(&dir.join(ADAPTER_WEIGHTS), tensors)
}

/// Whether `dir` holds an adapter (rather than full weights).
pub fn is_adapter_dir(dir: &Path) -> bool {
    dir.join(ADAPTER_CONFIG).is_file()
}

/// The local base model directory an adapter directory names (`base_model_name_or_path`);
/// models load from local directories only, so a name that is not one is an error saying so.
pub fn adapter_base_dir(dir: &Path) -> Result<std::path::PathBuf> {
    let path = dir.join(ADAPTER_CONFIG);
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| Error::bad_dir(dir, format!("{ADAPTER_CONFIG}: {e}")))?;
    let base = v["base_model_name_or_path"].as_str().filter(|b| !b.is_empty()).ok_or_else(|| {
        Error::bad_dir(dir, format!("{ADAPTER_CONFIG} names no base model (`base_model_name_or_path`)"))
    })?;
    // A hub id (PEFT writes the id the base was loaded by) is its snapshot in the local hub cache.
    let cached = rl_data::cached_model(base).map_err(|e| Error::bad_dir(dir, format!("{ADAPTER_CONFIG}: {e}")))?;
    let base = cached.unwrap_or_else(|| std::path::PathBuf::from(base));
    if !base.join("config.json").is_file() {
        return Err(Error::bad_dir(
            dir,
            format!(
                "its base model `{}` is not a local model directory nor in the Hugging Face hub cache (nothing is \
                 downloaded): fetch it (`hf download <id>`), point `base_model_name_or_path` in {ADAPTER_CONFIG} at \
                 a local copy of the base, or load the merged model",
                base.display()
            ),
        ));
    }
    Ok(base)
}

/// Reads an adapter directory (ours or PEFT's) as f32 tensors on `device`, checked against `cfg`.
pub fn read_adapter_dir(cfg: &ModelConfig, dir: &Path, device: &Device) -> Result<(Lora, HashMap<String, Tensor>)> {
    let path = dir.join(ADAPTER_CONFIG);
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let bad = |m: String| Error::bad_dir(dir, format!("{ADAPTER_CONFIG}: {m}"));
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    if v["peft_type"].as_str().is_some_and(|t| t != "LORA") {
        return Err(bad(format!("peft_type {} is not LORA", v["peft_type"])));
    }
    let rank = v["r"].as_u64().filter(|&r| r > 0).ok_or_else(|| bad(String::from("`r` must be a positive integer")))?;
    let alpha = v["lora_alpha"].as_f64().ok_or_else(|| bad(String::from("`lora_alpha` must be a number")))?;
    let modules: Vec<String> = match &v["target_modules"] {
        serde_json::Value::Array(a) => a.iter().filter_map(|m| m.as_str().map(str::to_owned)).collect(),
        other => return Err(bad(format!("`target_modules` must be a list of module names, got {other}"))),
    };
    for (key, ok) in [("use_rslora", false), ("use_dora", false), ("fan_in_fan_out", false)] {
        if v[key].as_bool().is_some_and(|b| b != ok) {
            return Err(bad(format!("`{key}: {}` is not supported", !ok)));
        }
    }
    let dropout = match &v["lora_dropout"] {
        serde_json::Value::Null => 0.0,
        d => d.as_f64().ok_or_else(|| bad(format!("`lora_dropout` must be a number, got {d}")))?,
    };
    let config = LoraConfig { rank: rank as u32, alpha, dropout, target_modules: modules };
    config.validate("adapter_config").map_err(|e| bad(e.to_string()))?;
    let lora = Lora::from_config(&config);
    let file = dir.join(ADAPTER_WEIGHTS);
    let tensors = candle_core::safetensors::load(&file, device)
        .map_err(|e| Error::bad_dir(dir, format!("cannot read {ADAPTER_WEIGHTS}: {e}")))?
        .into_iter()
        .map(|(n, t)| Ok((n, t.to_dtype(DType::F32)?)))
        .collect::<Result<HashMap<_, _>>>()?;
    check_adapters(cfg, &lora, &tensors, dir)?;
    Ok((lora, tensors))
}

/// `base` with every adapted projection replaced by `W + alpha / r * B A` (the function the
/// trainer computes unmerged), each in its base weight's dtype.
pub fn merge_adapters(
    cfg: &ModelConfig,
    lora: &Lora,
    base: &HashMap<String, Tensor>,
    adapters: &HashMap<String, Tensor>,
) -> Result<HashMap<String, Tensor>> {
    merge_adapters_as(cfg, lora, base, adapters, None)
}

/// [`merge_adapters`] with every weight in `dtype` when given (each base weight converted on its
/// own, not a converted copy of the whole base first).
pub(crate) fn merge_adapters_as(
    cfg: &ModelConfig,
    lora: &Lora,
    base: &HashMap<String, Tensor>,
    adapters: &HashMap<String, Tensor>,
    dtype: Option<DType>,
) -> Result<HashMap<String, Tensor>> {
    let mut out = base.clone();
    for i in 0..cfg.num_hidden_layers {
        for p in lora.targets() {
            let weight = format!("{}.weight", module_path(i, p));
            let get = |n: &str, m: &HashMap<String, Tensor>| {
                m.get(n).cloned().ok_or_else(|| Error::Input(format!("merging adapters: missing {n}")))
            };
            let w = get(&weight, base)?;
            let (a, b) = (get(&adapter_name(i, p, 'A'), adapters)?, get(&adapter_name(i, p, 'B'), adapters)?);
            let delta = (b.to_dtype(DType::F32)?.matmul(&a.to_dtype(DType::F32)?)? * lora.shape.scale)?;
            out.insert(weight, (w.to_dtype(DType::F32)? + delta)?.to_dtype(dtype.unwrap_or(w.dtype()))?);
        }
    }
    if let Some(dtype) = dtype {
        for t in out.values_mut() {
            *t = t.to_dtype(dtype)?;
        }
    }
    Ok(out)
}
