//! What the trainer trains — every weight, or LoRA adapters over frozen base weights — loaded at
//! the start or from a checkpoint, and written into broadcasts, checkpoints and the final model.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use rl_configs::LoraConfig;
use rl_model::{CausalLm, Lora, ModelConfig, Trainable, read_weights};

use crate::error::{Error, Result};

/// Where the trained weights come from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Source<'a> {
    /// The starting model's directory (the frozen base under adapters).
    pub src: &'a Path,
    /// A checkpoint to resume from.
    pub resume: Option<&'a Path>,
    /// Adapters instead of full fine-tuning.
    pub lora: Option<&'a LoraConfig>,
    /// Seeds the adapters' initialisation.
    pub seed: u64,
}

fn f32_weights(dir: &Path, device: &Device) -> Result<std::collections::HashMap<String, Tensor>> {
    read_weights(dir, device)?.into_iter().map(|(n, t)| Ok((n, t.to_dtype(DType::F32)?))).collect()
}

/// The trained variables (f32 master copies on `device`) and the model over them computing in
/// `compute` (bf16 on a GPU: weights are cast at each use, gradients and AdamW stay f32).
pub(crate) fn load(
    cfg: &ModelConfig,
    from: Source<'_>,
    device: &Device,
    compute: rl_configs::Dtype,
) -> Result<(Trainable, CausalLm)> {
    let vars = match from.lora {
        None => Trainable::from_tensors(cfg, &f32_weights(from.resume.unwrap_or(from.src), device)?)?,
        Some(c) => {
            let lora = Lora::from_config(c);
            let adapters = match from.resume {
                Some(dir) => {
                    let (saved, adapters) = rl_model::read_adapter_dir(cfg, dir, device)?;
                    if !saved.same_adapters(&lora) {
                        return Err(Error::Checkpoint {
                            path: dir.to_owned(),
                            message: format!(
                                "holds adapters of rank {} and alpha {} on {:?}, but the config asks for rank {} and \
                                 alpha {} on {:?}",
                                saved.shape.rank,
                                saved.alpha,
                                saved.targets(),
                                lora.shape.rank,
                                lora.alpha,
                                lora.targets()
                            ),
                        });
                    }
                    adapters
                }
                None => rl_model::init_adapters(cfg, &lora, from.seed, device)?,
            };
            // As stored: a bf16 checkpoint's layers stay bf16 (frozen, exact, half the bytes).
            Trainable::with_adapters(cfg, rl_model::read_stored_weights(from.src, device)?, &lora, &adapters)?
        }
    };
    let model = vars.model(cfg, device)?.with_compute_dtype(rl_model::compute_dtype(compute));
    if let Some((bytes, dtype)) = vars.frozen_layers() {
        tracing::info!(frozen_layers_mb = bytes >> 20, dtype = ?dtype, "LoRA: the base's decoder layers are frozen");
    }
    // The file's bytes and the conversions are not asked for again: hand back what the allocator
    // kept of them instead of carrying it through training.
    rl_kernels::release_kept_blocks();
    Ok((vars, model))
}

/// The trained tensors as written: every weight (`model.safetensors`), or the adapters (PEFT's
/// `adapter_config.json` + `adapter_model.safetensors`, naming `base`).
#[derive(Debug, Clone, Copy)]
pub struct Trained<'a> {
    /// The variables.
    pub vars: &'a Trainable,
    /// The base model's directory (named in an adapter's config).
    pub base: &'a Path,
    /// Written in this dtype when set (broadcasts to a bf16 engine).
    pub dtype: Option<DType>,
}

impl Trained<'_> {
    /// Writes the weights or adapters into the existing directory `dir`, each file atomically.
    pub fn write_into(&self, dir: &Path) -> Result<()> {
        let tensors = self
            .vars
            .tensors()
            .into_iter()
            .map(|(n, t)| Ok((n, self.dtype.map_or(Ok(t.clone()), |d| t.to_dtype(d))?)))
            .collect::<Result<Vec<_>>>()?;
        match self.vars.lora() {
            None => Ok(rl_model::write_safetensors(&dir.join(rl_model::MODEL_WEIGHTS), &tensors)?),
            Some(lora) => {
                let base = std::path::absolute(self.base).unwrap_or_else(|_| self.base.to_owned());
                Ok(rl_model::write_adapter_files(dir, lora, &base.to_string_lossy(), &tensors)?)
            }
        }
    }
}
