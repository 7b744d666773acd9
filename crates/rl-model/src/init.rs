//! `rl model init`: a complete HF-format directory with a random Qwen3 model, a character-level
//! or corpus-trained BPE tokenizer and a Qwen-style chat template. Weights ~ N(0, σ) with σ the
//! config's `initializer_range` (0.02 unless set), norms 1 (HF's initialisation).

use std::path::Path;

use candle_core::{DType, Device, Tensor};

use crate::chat::write_tokenizer_config;
use crate::config::{Family, ModelConfig, Preset, RopeScaling};
use crate::error::{Error, Result};
use crate::layout::weight_shapes;
use crate::rng::SplitMix64;
use crate::tokenizer::{BpePieces, SPECIAL_TOKENS, write_bpe_tokenizer, write_char_tokenizer};
use crate::weights::write_model_dir;

/// Which tokenizer a new model directory gets.
#[derive(Debug, Clone)]
pub enum NewTokenizer {
    /// One token per character (printable ASCII, newline, tab) plus the chat special tokens.
    Chars,
    /// A BPE of `vocab_size` entries trained on `texts` (over the same characters), merging
    /// within `pieces`.
    Bpe { texts: Vec<String>, vocab_size: usize, pieces: BpePieces },
}

/// Writes a random model of `preset` with the character-level tokenizer to `out` (replacing it
/// when `force`); returns its config.
pub fn init_model(out: &Path, preset: Preset, seed: u64, force: bool) -> Result<ModelConfig> {
    init_model_with(out, preset, seed, force, &NewTokenizer::Chars)
}

/// [`init_model`] with the tokenizer `tokenizer`.
pub fn init_model_with(
    out: &Path,
    preset: Preset,
    seed: u64,
    force: bool,
    tokenizer: &NewTokenizer,
) -> Result<ModelConfig> {
    init_model_as(out, preset, &PresetOverrides::default(), seed, force, tokenizer, DType::F32)
}

/// Fields set over a preset's (`rl model init --preset tiny --num-layers 6 --init-std 0.05`): a
/// model of the size and initial scale an experiment needs without a preset for each.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PresetOverrides {
    pub hidden_size: Option<usize>,
    pub intermediate_size: Option<usize>,
    pub num_hidden_layers: Option<usize>,
    pub num_attention_heads: Option<usize>,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    /// The standard deviation of the random weights, written as `initializer_range` (HF's
    /// `_init_weights` reads the same field).
    pub initializer_range: Option<f64>,
}

impl PresetOverrides {
    /// Sets the given fields on `cfg` and checks the result's shape relations.
    pub fn apply(&self, cfg: &mut ModelConfig) -> Result<()> {
        let fields = [
            (&mut cfg.hidden_size, self.hidden_size),
            (&mut cfg.intermediate_size, self.intermediate_size),
            (&mut cfg.num_hidden_layers, self.num_hidden_layers),
            (&mut cfg.num_attention_heads, self.num_attention_heads),
            (&mut cfg.num_key_value_heads, self.num_key_value_heads),
            (&mut cfg.head_dim, self.head_dim),
        ];
        for (field, value) in fields {
            if let Some(v) = value {
                *field = v;
            }
        }
        cfg.extra.insert(String::from("max_window_layers"), serde_json::json!(cfg.num_hidden_layers));
        if let Some(std) = self.initializer_range {
            if !(std.is_finite() && std > 0.0 && std <= 1.0) {
                return Err(Error::Input(format!("initializer_range must be in (0, 1], got {std}")));
            }
            cfg.extra.insert(String::from(INITIALIZER_RANGE), serde_json::json!(std));
        }
        cfg.check().map_err(|e| Error::Input(format!("model shape: {e}")))
    }
}

/// The config key of the weights' initial standard deviation, and its value when a config has none.
const INITIALIZER_RANGE: &str = "initializer_range";
const DEFAULT_INITIALIZER_RANGE: f64 = 0.02;

/// The standard deviation `cfg`'s random weights are drawn with.
fn initializer_range(cfg: &ModelConfig) -> f64 {
    cfg.extra.get(INITIALIZER_RANGE).and_then(serde_json::Value::as_f64).unwrap_or(DEFAULT_INITIALIZER_RANGE)
}

/// [`init_model_with`] with the weights stored in `dtype` (bf16: as released checkpoints are
/// stored; `config.json`'s `torch_dtype` says which) and the preset's fields changed by `overrides`.
pub fn init_model_as(
    out: &Path,
    preset: Preset,
    overrides: &PresetOverrides,
    seed: u64,
    force: bool,
    tokenizer: &NewTokenizer,
    dtype: DType,
) -> Result<ModelConfig> {
    let torch_dtype = match dtype {
        DType::F32 => "float32",
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        other => return Err(Error::Input(format!("weights are stored in f32, bf16 or f16, not {other:?}"))),
    };
    if out.exists() && std::fs::read_dir(out).map_err(|e| Error::io(out, e))?.next().is_some() && !force {
        return Err(Error::bad_dir(out, "already exists and is not empty (pass --force to replace it)"));
    }
    // Unique per call: concurrent inits in one process (tests) must not share a scratch directory.
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let scratch = std::env::temp_dir().join(format!("rl-model-init-{}-{seed}-{call}", std::process::id()));
    std::fs::create_dir_all(&scratch).map_err(|e| Error::io(&scratch, e))?;
    let result = (|| {
        let path = scratch.join("tokenizer.json");
        let vocab = match tokenizer {
            NewTokenizer::Chars => write_char_tokenizer(&path)?,
            NewTokenizer::Bpe { texts, vocab_size, pieces } => {
                write_bpe_tokenizer(&path, texts.iter(), *vocab_size, *pieces)?
            }
        };
        write_tokenizer_config(&scratch.join("tokenizer_config.json"), SPECIAL_TOKENS)?;
        let generation = serde_json::json!({"eos_token_id": [2, 0], "pad_token_id": 0});
        std::fs::write(scratch.join("generation_config.json"), generation.to_string())
            .map_err(|e| Error::io(&scratch, e))?;
        let mut cfg = ModelConfig::preset(preset, preset.vocab_size().unwrap_or(vocab.div_ceil(64) * 64));
        cfg.eos_token_id = Some(serde_json::json!(2));
        overrides.apply(&mut cfg)?;
        cfg.extra.insert(String::from("torch_dtype"), serde_json::json!(torch_dtype));
        let tensors = random_weights_as(&cfg, seed, dtype)?;
        write_model_dir(out, &cfg, &tensors, &scratch)?;
        Ok(cfg)
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

/// A very small architecture (hidden 16, 2 layers, 2/1 heads of 8) for tests: fast, and small
/// enough for finite-difference checks.
pub fn micro_config(vocab_size: usize) -> ModelConfig {
    let mut cfg = ModelConfig::preset(crate::config::Preset::Tiny, vocab_size);
    cfg.hidden_size = 16;
    cfg.intermediate_size = 24;
    cfg.num_hidden_layers = 2;
    cfg.num_attention_heads = 2;
    cfg.num_key_value_heads = 1;
    cfg.head_dim = 8;
    cfg.max_position_embeddings = 64;
    cfg
}

/// [`micro_config`] of `family`, with each family's distinguishing parts switched on: Qwen2's
/// q/k/v biases; Llama with `attention_bias` (q/k/v/o biases) and a `llama3` rope scaling whose
/// original context (16) lies inside the micro model's 64 positions, so all three frequency bands
/// (kept, blended, scaled) are in use.
pub fn micro_config_of(family: Family, vocab_size: usize) -> ModelConfig {
    let mut cfg = micro_config(vocab_size);
    cfg.family = family;
    if family == Family::Llama {
        cfg.attention_bias = true;
        cfg.rope_scaling = Some(RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 16.0,
        });
    }
    cfg
}

/// `random_weights` with every weight but the norms multiplied by `scale` (a micro model with the
/// usual 0.02 init is nearly uniform), converted to `dtype`.
pub fn scaled_random_weights(
    cfg: &ModelConfig,
    seed: u64,
    scale: f64,
    dtype: DType,
) -> Result<std::collections::HashMap<String, Tensor>> {
    random_weights(cfg, seed)?
        .into_iter()
        .map(|(n, t)| {
            let t = if n.contains("norm") { t } else { (t * scale)? };
            Ok((n, t.to_dtype(dtype)?))
        })
        .collect()
}

/// Random weights for `cfg`: N(0, `initializer_range`) matrices and biases, ones for norms.
pub fn random_weights(cfg: &ModelConfig, seed: u64) -> Result<Vec<(String, Tensor)>> {
    random_weights_as(cfg, seed, DType::F32)
}

/// [`random_weights`] with each weight converted to `dtype` as it is drawn (a bf16 checkpoint's
/// values, without the f32 weights all in memory at once).
pub fn random_weights_as(cfg: &ModelConfig, seed: u64, dtype: DType) -> Result<Vec<(String, Tensor)>> {
    let device = Device::Cpu;
    let mut rng = Normal(SplitMix64::new(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0x1234_5678));
    let std = initializer_range(cfg) as f32;
    let mut out = Vec::new();
    for (name, shape) in weight_shapes(cfg) {
        let t = if name.ends_with("norm.weight") {
            Tensor::ones(shape, DType::F32, &device)?
        } else {
            let data: Vec<f32> = (0..shape.iter().product::<usize>()).map(|_| rng.next() * std).collect();
            Tensor::from_vec(data, shape, &device)?
        };
        out.push((name, t.to_dtype(dtype)?));
    }
    Ok(out)
}

/// Standard normal samples (Box–Muller over SplitMix64).
struct Normal(SplitMix64);

impl Normal {
    fn next(&mut self) -> f32 {
        // Shift into (0, 1) so the logarithm is finite.
        let half = 0.5 / (1u64 << 53) as f64;
        let (u1, u2) = (self.0.uniform() + half, self.0.uniform() + half);
        ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
    }
}
