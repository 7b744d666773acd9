//! Model directories: loading weights (any float dtype, converted to f32; single or sharded
//! safetensors) as plain tensors for inference or as `Var`s for training, and saving them under
//! the HF names, atomically.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::VarBuilder;
use rl_configs::run_dir::{persist, temp_path};

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::model::CausalLm;

/// The HF name and shape of every weight the model reads, in a stable order (the one owner of
/// the families' weight layouts).
pub fn weight_shapes(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let (h, hd, inter) = (cfg.hidden_size, cfg.head_dim, cfg.intermediate_size);
    let (q, kv) = (cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd);
    let mut out = vec![(String::from("model.embed_tokens.weight"), vec![cfg.vocab_size, h])];
    for i in 0..cfg.num_hidden_layers {
        let l = format!("model.layers.{i}");
        let mut push = |name: String, shape: &[usize]| out.push((name, shape.to_vec()));
        for (p, rows) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
            push(format!("{l}.self_attn.{p}.weight"), &[rows, h]);
            if cfg.qkv_bias() {
                push(format!("{l}.self_attn.{p}.bias"), &[rows]);
            }
        }
        push(format!("{l}.self_attn.o_proj.weight"), &[h, q]);
        if cfg.o_bias() {
            push(format!("{l}.self_attn.o_proj.bias"), &[h]);
        }
        if cfg.qk_norm() {
            push(format!("{l}.self_attn.q_norm.weight"), &[hd]);
            push(format!("{l}.self_attn.k_norm.weight"), &[hd]);
        }
        push(format!("{l}.mlp.gate_proj.weight"), &[inter, h]);
        push(format!("{l}.mlp.up_proj.weight"), &[inter, h]);
        push(format!("{l}.mlp.down_proj.weight"), &[h, inter]);
        push(format!("{l}.input_layernorm.weight"), &[h]);
        push(format!("{l}.post_attention_layernorm.weight"), &[h]);
    }
    out.push((String::from("model.norm.weight"), vec![h]));
    if !cfg.tie_word_embeddings {
        out.push((String::from("lm_head.weight"), vec![cfg.vocab_size, h]));
    }
    out
}

/// The HF names of every weight the model reads, in a stable order.
pub fn weight_names(cfg: &ModelConfig) -> Vec<String> {
    weight_shapes(cfg).into_iter().map(|(name, _)| name).collect()
}

/// Reads every tensor of `model.safetensors` (or the shards listed in
/// `model.safetensors.index.json`) as f32 on `device`.
pub fn read_weights(dir: &Path, device: &Device) -> Result<HashMap<String, Tensor>> {
    let single = dir.join("model.safetensors");
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
            out.insert(name, t.to_dtype(DType::F32)?);
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
        return Err(Error::bad_dir(dir, "has no config.json (is it an HF-format model directory?)"));
    }
    ModelConfig::load(&path)
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

/// Trainable weights: one `Var` per HF name, in [`weight_names`] order.
#[derive(Debug, Clone)]
pub struct Trainable {
    /// (name, variable).
    pub vars: Vec<(String, Var)>,
}

impl Trainable {
    /// Wraps tensors as variables (every tensor the model reads).
    pub fn from_tensors(cfg: &ModelConfig, tensors: &HashMap<String, Tensor>) -> Result<Self> {
        let mut vars = Vec::new();
        for name in weight_names(cfg) {
            let t = tensors.get(&name).ok_or_else(|| Error::Input(format!("missing weight {name}")))?;
            vars.push((name, Var::from_tensor(t)?));
        }
        Ok(Trainable { vars })
    }

    /// A model whose weights are these variables (gradients flow to them), in their dtype.
    pub fn model(&self, cfg: &ModelConfig, device: &Device) -> Result<CausalLm> {
        let dtype = self.vars.first().map_or(DType::F32, |(_, v)| v.dtype());
        let map: HashMap<String, Tensor> = self.vars.iter().map(|(n, v)| (n.clone(), v.as_tensor().clone())).collect();
        CausalLm::new(cfg, &VarBuilder::from_tensors(map, dtype, device))
    }

    /// Current values, detached.
    pub fn tensors(&self) -> Vec<(String, Tensor)> {
        self.vars.iter().map(|(n, v)| (n.clone(), v.as_tensor().detach())).collect()
    }
}

/// Loads a model's weights as trainable variables.
pub fn load_trainable(dir: &Path, device: &Device) -> Result<(ModelConfig, Trainable)> {
    let cfg = read_config(dir)?;
    let tensors = read_weights(dir, device)?;
    check_names(dir, &cfg, &tensors)?;
    Ok((cfg.clone(), Trainable::from_tensors(&cfg, &tensors)?))
}

/// Writes `tensors` to `path` as safetensors, atomically and durably (temp file, fsync, rename).
pub fn write_safetensors(path: &Path, tensors: &[(String, Tensor)]) -> Result<()> {
    let map: HashMap<String, Tensor> = tensors.iter().map(|(n, t)| (n.clone(), t.clone())).collect();
    let tmp = temp_path(path);
    if let Err(e) = candle_core::safetensors::save(&map, &tmp) {
        let _ = std::fs::remove_file(&tmp);
        // candle's error does not say which file: a full disk must name it.
        return Err(match e {
            candle_core::Error::Io(source) => Error::io(path, source),
            other => Error::Input(format!("cannot write {}: {other}", path.display())),
        });
    }
    Ok(persist(&tmp, path)?)
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
        write_safetensors(&tmp.join("model.safetensors"), tensors)?;
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
