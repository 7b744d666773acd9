//! Model directories: loading weights (any float dtype, converted to f32; single or sharded
//! safetensors) as plain tensors for inference or as `Var`s for training, and saving them under
//! the HF names, atomically.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::VarBuilder;
use rl_run::{persist, temp_path};

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::layout::{EMBED, FINAL_NORM, LM_HEAD, layer_part_shapes, weight_names};
use crate::lora::Lora;
use crate::model::CausalLm;
use crate::tensor_file::write_safetensors;

/// The weights file of an unsharded HF model directory.
pub const MODEL_WEIGHTS: &str = "model.safetensors";

/// Reads every tensor of `model.safetensors` (or the shards listed in
/// `model.safetensors.index.json`) as f32 on `device`.
pub fn read_weights(dir: &Path, device: &Device) -> Result<HashMap<String, Tensor>> {
    read_tensors(dir, device, Some(DType::F32))
}

/// [`read_weights`] with every tensor in the dtype its file stores it in (a LoRA base from a bf16
/// checkpoint stays bf16: [`Trainable::with_adapters`] holds it so without an f32 copy).
pub fn read_stored_weights(dir: &Path, device: &Device) -> Result<HashMap<String, Tensor>> {
    read_tensors(dir, device, None)
}

/// Every tensor of the model directory `dir`, in `dtype` when given, each shard converted as it
/// is read.
fn read_tensors(dir: &Path, device: &Device, dtype: Option<DType>) -> Result<HashMap<String, Tensor>> {
    let single = dir.join(MODEL_WEIGHTS);
    let files: Vec<PathBuf> = if single.exists() {
        vec![single]
    } else {
        let index = dir.join("model.safetensors.index.json");
        if !std::fs::metadata(&index).is_ok_and(|m| m.is_file()) {
            return Err(Error::bad_dir(dir, "has neither model.safetensors nor model.safetensors.index.json"));
        }
        let text = std::fs::read_to_string(&index)
            .map_err(|_| Error::bad_dir(dir, "has neither model.safetensors nor model.safetensors.index.json"))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| Error::bad_dir(dir, format!("bad safetensors index: {e}")))?;
        let mut shards: Vec<String> = v["weight_map"]
            .as_object()
            .ok_or_else(|| Error::bad_dir(dir, "safetensors index has no weight_map"))?
            .values()
            .filter_map(|f| f.as_str().map(str::to_owned))
            .collect();
        shards.sort();
        shards.dedup();
        // A shard is a file of this directory: an index naming `../x` or `/etc/x` would make a
        // weight load (e.g. `/update_weights`) read, and its errors reveal, files elsewhere.
        if let Some(bad) = shards.iter().find(|f| !is_plain_file_name(f)) {
            return Err(Error::bad_dir(dir, format!("safetensors index names a shard outside the directory: {bad:?}")));
        }
        shards.into_iter().map(|f| dir.join(f)).collect()
    };
    let mut out = HashMap::new();
    for file in files {
        // Only regular files (after symlinks): a FIFO or device would block the read forever.
        if !std::fs::metadata(&file).is_ok_and(|m| m.is_file()) {
            let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            return Err(Error::bad_dir(dir, format!("{name} is not a regular file")));
        }
        let tensors = candle_core::safetensors::load(&file, device)
            .map_err(|e| Error::bad_dir(dir, format!("cannot read {}: {e}", file.display())))?;
        for (name, t) in tensors {
            out.insert(
                name,
                match dtype {
                    Some(d) => t.to_dtype(d)?,
                    None => t,
                },
            );
        }
    }
    Ok(out)
}

/// A file name with no directory part (not `.`, `..`, absolute or containing a separator).
fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(['/', '\\', '\0']) && name != "." && name != ".."
}

/// A model directory's config.
pub fn read_config(dir: &Path) -> Result<ModelConfig> {
    let path = dir.join("config.json");
    if !path.exists() {
        return Err(Error::bad_dir(dir, not_a_model(dir)));
    }
    ModelConfig::load(&path)
}

/// Why `dir` (without a config.json) is not a model directory; a PEFT adapter directory (what
/// `rl sft` / `rl rl` write to `<run>/adapter`) is named as one, with where its model is.
fn not_a_model(dir: &Path) -> String {
    if !dir.exists() && !dir.to_str().is_some_and(rl_data::looks_like_hub_id) {
        return String::from("does not exist");
    }
    if !dir.exists() {
        // Perhaps a hub id: commands resolve those from the local hub cache, never the network.
        let cache = rl_data::hub_cache_dir().map_or_else(|| String::from("unset"), |c| c.display().to_string());
        return format!(
            "does not exist, and is not a model in the Hugging Face hub cache ({cache}); nothing is downloaded: \
             for a hub id, fetch it once (`hf download {}`) or give a local model directory",
            dir.display()
        );
    }
    let Ok(text) = std::fs::read_to_string(dir.join("adapter_config.json")) else {
        return String::from("has no config.json (is it an HF-format model directory?)");
    };
    let base = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|c| c["base_model_name_or_path"].as_str().map(str::to_owned))
        .map_or_else(String::new, |b| format!(" over the base model {b}"));
    let merged = dir.parent().map(|p| p.join("model")).filter(|m| m.join("config.json").exists());
    let merged = merged.map_or_else(String::new, |m| format!(" ({} holds it merged)", m.display()));
    format!(
        "is a LoRA adapter (adapter_config.json){base}, not a model: load the merged model{merged}, or \
         `rl model merge` it into one"
    )
}

fn check_names(dir: &Path, cfg: &ModelConfig, tensors: &HashMap<String, Tensor>) -> Result<()> {
    let missing: Vec<String> = weight_names(cfg).into_iter().filter(|n| !tensors.contains_key(n)).collect();
    if !missing.is_empty() {
        return Err(Error::bad_dir(dir, format!("missing {} weight(s), e.g. {}", missing.len(), missing[0])));
    }
    Ok(())
}

/// Loads a model for inference.
pub fn load_model(dir: &Path, device: &Device) -> Result<CausalLm> {
    let cfg = read_config(dir)?;
    load_weights_for(&cfg, dir, device)
}

/// Loads `dir` to serve: a model directory, or a LoRA adapter directory over the local base it
/// names (as PEFT's `AutoPeftModelForCausalLM` loads one). Returns the model and its base's
/// directory (tokenizer, chat template, the base of later adapter updates). `unmerged`: the
/// adapters ride on the frozen base (the CPU runtime computes them apart, `W x + s B A x`);
/// otherwise they are merged into the weights.
pub fn load_model_or_adapter(dir: &Path, device: &Device, unmerged: bool) -> Result<(CausalLm, PathBuf)> {
    if !crate::is_adapter_dir(dir) || dir.join("config.json").exists() {
        return Ok((load_model(dir, device)?, dir.to_owned()));
    }
    let base_dir = crate::lora::adapter_base_dir(dir)?;
    let cfg = read_config(&base_dir)?;
    let base = read_weights(&base_dir, device)?;
    check_names(&base_dir, &cfg, &base)?;
    let (lora, adapters) = crate::read_adapter_dir(&cfg, dir, device)?;
    let model = if unmerged {
        Trainable::with_adapters(&cfg, base, &lora, &adapters)?.model(&cfg, device)?
    } else {
        model_from_weights(&cfg, dir, crate::merge_adapters(&cfg, &lora, &base, &adapters)?, device)?
    };
    Ok((model, base_dir))
}

/// Loads the weights in `dir` (a weight broadcast: `model.safetensors` without a config) into a
/// model of architecture `cfg`; names and shapes must match exactly.
pub fn load_weights_for(cfg: &ModelConfig, dir: &Path, device: &Device) -> Result<CausalLm> {
    model_from_weights(cfg, dir, read_weights(dir, device)?, device)
}

/// A model of architecture `cfg` from tensors [`read_weights`] read out of `dir` (named in
/// errors); names and shapes must match exactly. Tensors are moved to `device` as needed.
pub fn model_from_weights(
    cfg: &ModelConfig,
    dir: &Path,
    tensors: HashMap<String, Tensor>,
    device: &Device,
) -> Result<CausalLm> {
    check_names(dir, cfg, &tensors)?;
    CausalLm::new(cfg, &VarBuilder::from_tensors(tensors, DType::F32, device))
        .map_err(|e| Error::bad_dir(dir, format!("weights do not fit the served model: {e}")))
}

/// One HF weight inside a trainable variable: elements `offset..offset + len` of `vars[var]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    /// The HF name.
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Index of the variable holding it in [`Trainable::vars`].
    pub var: usize,
    /// Its first element in the (flattened) variable.
    pub offset: usize,
}

/// Trainable weights. Each decoder layer's weights are one flat `Var` (named `model.layers.{i}`,
/// laid out as [`layer_part_shapes`]) that the fused layer op takes as it is, so a step neither
/// concatenates them nor splits and accumulates their gradients; the embedding, final norm and
/// untied output head are one `Var` each under their HF names. [`Trainable::tensors`] gives every
/// weight under its HF name.
#[derive(Debug, Clone)]
pub struct Trainable {
    /// The optimizer's variables: (name, variable).
    pub vars: Vec<(String, Var)>,
    /// Every HF weight and where it lives, in [`weight_names`] order.
    parts: Vec<Part>,
    /// Each layer's flat variable, by layer.
    layers: Vec<usize>,
    /// With LoRA: the adapters' shape and the frozen base weights (plain tensors, no gradient,
    /// no optimizer state); the variables are then the adapters, one flat buffer per layer.
    frozen: Option<Frozen>,
}

/// Frozen base weights under adapters: each layer's weights are one flat tensor, as the fused
/// layer op takes them (built once, not at every forward; on the CPU in bf16 when its values all
/// are bf16 values, see `frozen_base`), and the HF-named tensors are views of it.
#[derive(Debug, Clone)]
struct Frozen {
    lora: Lora,
    /// Every base weight by HF name (layer weights: views of `layers`).
    base: HashMap<String, Tensor>,
    /// Each layer's flat weights, in [`layer_part_shapes`] order.
    layers: Vec<Tensor>,
}

impl Trainable {
    /// Wraps tensors as variables (every tensor the model reads).
    pub fn from_tensors(cfg: &ModelConfig, tensors: &HashMap<String, Tensor>) -> Result<Self> {
        let get = |name: &str| tensors.get(name).ok_or_else(|| Error::Input(format!("missing weight {name}")));
        let (mut vars, mut parts, mut layers) = (Vec::new(), Vec::new(), Vec::new());
        let single = |name: &str, vars: &mut Vec<(String, Var)>, parts: &mut Vec<Part>| -> Result<()> {
            let t = get(name)?;
            parts.push(Part { name: name.to_owned(), shape: t.dims().to_vec(), var: vars.len(), offset: 0 });
            vars.push((name.to_owned(), Var::from_tensor(t)?));
            Ok(())
        };
        single(EMBED, &mut vars, &mut parts)?;
        for i in 0..cfg.num_hidden_layers {
            let mut flat = Vec::new();
            let mut offset = 0;
            for (name, shape) in layer_part_shapes(cfg, i) {
                let t = get(&name)?;
                if t.dims() != shape.as_slice() {
                    return Err(Error::Input(format!("{name} is {:?}, expected {shape:?}", t.dims())));
                }
                flat.push(t.flatten_all()?);
                parts.push(Part { name, shape: shape.clone(), var: vars.len(), offset });
                offset += shape.iter().product::<usize>();
            }
            layers.push(vars.len());
            vars.push((format!("model.layers.{i}"), Var::from_tensor(&Tensor::cat(&flat, 0)?)?));
        }
        single(FINAL_NORM, &mut vars, &mut parts)?;
        if !cfg.tie_word_embeddings {
            single(LM_HEAD, &mut vars, &mut parts)?;
        }
        let order: HashMap<String, usize> = weight_names(cfg).into_iter().enumerate().map(|(i, n)| (n, i)).collect();
        parts.sort_by_key(|p| order.get(&p.name).copied().unwrap_or(usize::MAX));
        Ok(Trainable { vars, parts, layers, frozen: None })
    }

    /// Adapters over frozen `base` weights: each layer's adapters ([`crate::adapter_shapes`],
    /// PEFT's names, taken from `adapters`) are one flat variable, the only ones trained.
    pub fn with_adapters(
        cfg: &ModelConfig,
        base: HashMap<String, Tensor>,
        lora: &Lora,
        adapters: &HashMap<String, Tensor>,
    ) -> Result<Self> {
        let (mut vars, mut parts, mut layers) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..cfg.num_hidden_layers {
            let (mut flat, mut offset) = (Vec::new(), 0);
            for (name, shape) in crate::lora::adapter_shapes(cfg, lora, i) {
                let t = adapters.get(&name).ok_or_else(|| Error::Input(format!("missing adapter {name}")))?;
                if t.dims() != shape.as_slice() {
                    return Err(Error::Input(format!("{name} is {:?}, expected {shape:?}", t.dims())));
                }
                flat.push(t.to_dtype(DType::F32)?.flatten_all()?);
                parts.push(Part { name, shape: shape.clone(), var: vars.len(), offset });
                offset += shape.iter().product::<usize>();
            }
            layers.push(vars.len());
            vars.push((format!("model.layers.{i}.lora"), Var::from_tensor(&Tensor::cat(&flat, 0)?)?));
        }
        // Each layer's weights as read (bf16 from a bf16 checkpoint: never widened whole), the
        // other weights in f32.
        let mut base: HashMap<String, Tensor> = base.into_iter().map(|(n, t)| (n, t.detach())).collect();
        let mut flats = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let shapes = layer_part_shapes(cfg, i);
            let mut parts = Vec::with_capacity(shapes.len());
            for (name, shape) in &shapes {
                let t = base.get(name).ok_or_else(|| Error::Input(format!("missing weight {name}")))?;
                if t.dims() != shape.as_slice() {
                    return Err(Error::Input(format!("{name} is {:?}, expected {shape:?}", t.dims())));
                }
                parts.push(t.flatten_all()?);
            }
            let flat = crate::frozen_base::layer_flat(&parts)?;
            drop(parts);
            let mut offset = 0;
            for (name, shape) in shapes {
                let len: usize = shape.iter().product();
                base.insert(name, flat.narrow(0, offset, len)?.reshape(shape.as_slice())?);
                offset += len;
            }
            flats.push(flat);
        }
        for name in [EMBED, FINAL_NORM, LM_HEAD] {
            if let Some(t) = base.get_mut(name) {
                *t = t.to_dtype(DType::F32)?;
            }
        }
        Ok(Trainable { vars, parts, layers, frozen: Some(Frozen { lora: lora.clone(), base, layers: flats }) })
    }

    /// Every weight under its HF name, detached: with adapters, merged into the base weights.
    pub fn merged(&self, cfg: &ModelConfig) -> Result<Vec<(String, Tensor)>> {
        let mut out: Vec<(String, Tensor)> = match &self.frozen {
            None => self.tensors(),
            Some(f) => {
                let adapters: HashMap<String, Tensor> = self.tensors().into_iter().collect();
                // In f32, as the trained weights are (a bf16-held base widens exactly).
                let merged = crate::lora::merge_adapters_as(cfg, &f.lora, &f.base, &adapters, Some(DType::F32))?;
                merged.into_iter().collect()
            }
        };
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// The adapters, when these are adapters over frozen weights.
    pub fn lora(&self) -> Option<&Lora> {
        self.frozen.as_ref().map(|f| &f.lora)
    }

    /// The frozen decoder-layer weights' bytes and the dtype they are held in (bf16 on the CPU
    /// when the base's values all are bf16 values), when these are adapters over frozen weights.
    pub fn frozen_layers(&self) -> Option<(usize, DType)> {
        let f = self.frozen.as_ref()?;
        let bytes = f.layers.iter().map(|t| t.elem_count() * t.dtype().size_in_bytes()).sum();
        let dtype = f.layers.first().map_or(DType::F32, Tensor::dtype);
        Some((bytes, dtype))
    }

    /// Every HF weight and the variable elements that hold it, in [`weight_names`] order.
    pub fn parts(&self) -> &[Part] {
        &self.parts
    }

    /// The part of `t` (a tensor shaped like its variable: the variable itself or its gradient)
    /// that holds `part`, in the weight's shape.
    pub fn part_of(&self, part: &Part, t: &Tensor) -> Result<Tensor> {
        if !self.layers.contains(&part.var) {
            return Ok(t.clone());
        }
        let len = part.shape.iter().product();
        Ok(t.narrow(0, part.offset, len)?.reshape(part.shape.as_slice())?)
    }

    /// Each flat layer variable's name and the HF names of its parts, in order (to regroup
    /// per-weight optimizer state saved by earlier versions).
    pub fn groups(&self) -> Vec<(String, Vec<String>)> {
        self.layers
            .iter()
            .map(|&v| {
                let names = self.parts.iter().filter(|p| p.var == v).map(|p| (p.offset, p.name.clone()));
                let mut names: Vec<(usize, String)> = names.collect();
                names.sort();
                (self.vars[v].0.clone(), names.into_iter().map(|(_, n)| n).collect())
            })
            .collect()
    }

    /// A model whose weights are these variables (gradients flow to them), in their dtype; with
    /// adapters, the frozen base weights carrying them.
    pub fn model(&self, cfg: &ModelConfig, device: &Device) -> Result<CausalLm> {
        if let Some(f) = &self.frozen {
            // As held: bf16 layer weights are not copied to f32 (the model casts where it uses them).
            let held = Box::new(crate::frozen_base::AsHeld(f.base.clone()));
            let mut model = CausalLm::new(cfg, &VarBuilder::from_backend(held, DType::F32, device.clone()))?;
            for ((layer, &v), flat) in model.layers.iter_mut().zip(&self.layers).zip(&f.layers) {
                layer.lora = Some(self.vars[v].1.as_tensor().clone());
                layer.flat = Some(flat.clone());
            }
            model.lora = Some(f.lora.shape);
            model.lora_dropout = f.lora.dropout;
            return Ok(model);
        }
        let dtype = self.vars.first().map_or(DType::F32, |(_, v)| v.dtype());
        let map: HashMap<String, Tensor> = self
            .parts
            .iter()
            .map(|p| Ok((p.name.clone(), self.part_of(p, self.vars[p.var].1.as_tensor())?)))
            .collect::<Result<_>>()?;
        let mut model = CausalLm::new(cfg, &VarBuilder::from_tensors(map, dtype, device))?;
        for (layer, &v) in model.layers.iter_mut().zip(&self.layers) {
            layer.flat = Some(self.vars[v].1.as_tensor().clone());
        }
        Ok(model)
    }

    /// Current values of what is trained under their names, detached: every weight (HF names),
    /// or with LoRA the adapters (PEFT names).
    pub fn tensors(&self) -> Vec<(String, Tensor)> {
        self.parts
            .iter()
            .map(|p| {
                let t = self.vars[p.var].1.as_tensor().detach();
                (p.name.clone(), self.part_of(p, &t).expect("a part lies inside its variable"))
            })
            .collect()
    }
}

/// Loads a model's weights as trainable variables.
pub fn load_trainable(dir: &Path, device: &Device) -> Result<(ModelConfig, Trainable)> {
    let cfg = read_config(dir)?;
    let tensors = read_weights(dir, device)?;
    check_names(dir, &cfg, &tensors)?;
    Ok((cfg.clone(), Trainable::from_tensors(&cfg, &tensors)?))
}

/// Writes a complete model directory at `out`: `config.json`, `model.safetensors`, and the
/// tokenizer files copied from `tokenizer_dir`. Built in a sibling temp directory, then renamed,
/// so `out` is never half-written. An existing `out` is replaced.
pub fn write_model_dir(
    out: &Path,
    cfg: &ModelConfig,
    tensors: &[(String, Tensor)],
    tokenizer_dir: &Path,
) -> Result<()> {
    let tmp = temp_path(out);
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    let result = (|| {
        let cfg_text = serde_json::to_string_pretty(cfg).expect("configs serialize");
        std::fs::write(tmp.join("config.json"), cfg_text).map_err(|e| Error::io(tmp.join("config.json"), e))?;
        write_safetensors(&tmp.join(MODEL_WEIGHTS), tensors)?;
        for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json"] {
            let src = tokenizer_dir.join(f);
            if src.exists() {
                std::fs::copy(&src, tmp.join(f)).map_err(|e| Error::io(&src, e))?;
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A LoRA base whose values all are bf16 values (read in bf16, or in f32) is held in bf16 (half
    /// the bytes) and gives the logits and adapter gradients the same base held in f32 gives, to
    /// the bit.
    #[test]
    fn a_bf16_held_base_computes_what_the_f32_one_does_to_the_bit() {
        let cfg = crate::micro_config_of(crate::Family::Qwen3, 40);
        let stored: HashMap<String, Tensor> = crate::scaled_random_weights(&cfg, 5, 10.0, DType::BF16).unwrap();
        let base: HashMap<String, Tensor> =
            stored.iter().map(|(n, t)| (n.clone(), t.to_dtype(DType::F32).unwrap())).collect();
        let lora = Lora::from_config(&rl_configs::LoraConfig { rank: 4, alpha: 8.0, ..Default::default() });
        let mut adapters = crate::init_adapters(&cfg, &lora, 1, &Device::Cpu).unwrap();
        for (name, t) in adapters.iter_mut() {
            if name.contains("lora_B") {
                *t = (t.ones_like().unwrap() * 0.02).unwrap();
            }
        }
        let held = Trainable::with_adapters(&cfg, base, &lora, &adapters).unwrap();
        let (bytes, dtype) = held.frozen_layers().unwrap();
        assert_eq!(dtype, DType::BF16);
        let mut wide = held.clone();
        let f = wide.frozen.as_mut().unwrap();
        f.layers = f.layers.iter().map(|t| t.to_dtype(DType::F32).unwrap()).collect();
        f.base = f.base.iter().map(|(n, t)| (n.clone(), t.to_dtype(DType::F32).unwrap())).collect();
        assert_eq!(wide.frozen_layers().unwrap(), (2 * bytes, DType::F32));

        let run = |t: &Trainable| {
            let model = t.model(&cfg, &Device::Cpu).unwrap();
            let ids = [3u32, 17, 5, 30, 9, 22, 11, 2];
            let logits = model.forward_packed(&[ids.to_vec()], &[(0..8).collect()]).unwrap();
            let loss = candle_nn::ops::log_softmax(&logits, candle_core::D::Minus1).unwrap().mean_all().unwrap();
            let grads = loss.backward().unwrap();
            let grad = |v: &Var| grads.get(v.as_tensor()).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let flat = logits.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            (flat, t.vars.iter().map(|(_, v)| grad(v)).collect::<Vec<_>>())
        };
        let (a, b) = (run(&held), run(&wide));
        assert!(a.1.iter().flatten().any(|g| *g != 0.0), "the adapters get gradients");
        assert_eq!(a, b);
        let from_stored = Trainable::with_adapters(&cfg, stored, &lora, &adapters).unwrap();
        assert_eq!(from_stored.frozen_layers().unwrap(), (bytes, DType::BF16));
        assert_eq!(run(&from_stored), a);
        // Merged in f32 either way, to the same values.
        let values = |t: &Trainable| -> Vec<(String, DType, Vec<f32>)> {
            let merged = t.merged(&cfg).unwrap();
            merged.iter().map(|(n, w)| (n.clone(), w.dtype(), w.flatten_all().unwrap().to_vec1().unwrap())).collect()
        };
        let merged = values(&held);
        assert!(merged.iter().all(|(_, dtype, _)| *dtype == DType::F32));
        assert_eq!(merged, values(&wide));
    }

    #[test]
    fn an_adapter_directory_is_named_as_one_with_its_base_and_merged_model() {
        let run = tempfile::tempdir().unwrap();
        let adapter = run.path().join("adapter");
        std::fs::create_dir_all(&adapter).unwrap();
        std::fs::write(adapter.join("adapter_config.json"), r#"{"base_model_name_or_path": "/models/base"}"#).unwrap();
        let text = read_config(&adapter).unwrap_err().to_string();
        assert!(text.contains("is a LoRA adapter") && text.contains("over the base model /models/base"), "{text}");
        assert!(!text.contains("holds it merged"), "no merged model beside it yet: {text}");
        std::fs::create_dir_all(run.path().join("model")).unwrap();
        std::fs::write(run.path().join("model/config.json"), "{}").unwrap();
        let text = read_config(&adapter).unwrap_err().to_string();
        assert!(text.contains(&format!("{} holds it merged", run.path().join("model").display())), "{text}");
        let empty = tempfile::tempdir().unwrap();
        let text = read_config(empty.path()).unwrap_err().to_string();
        assert!(text.contains("is it an HF-format model directory?"), "{text}");
    }
}
