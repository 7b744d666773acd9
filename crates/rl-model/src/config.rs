//! A decoder's `config.json` (HF names) for the families this crate runs (Qwen3, Qwen2/Qwen2.5,
//! Llama 3), selected by `model_type`; rope scaling; and the `rl model init` presets (Qwen3).

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};

/// The architectures this crate runs, from `config.json`'s `model_type`. They share one code
/// path and differ only in the attention block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// Qwen3: RMSNorm on every q/k head before RoPE, no biases (unless `attention_bias`).
    Qwen3,
    /// Qwen2 / Qwen2.5: biases on the q, k and v projections, no q/k norm.
    Qwen2,
    /// Llama (3.x): no q/k norm, biases only with `attention_bias`; `llama3` rope scaling.
    Llama,
}

impl Family {
    /// Every `model_type` this crate runs.
    pub const NAMES: &[&str] = &["qwen3", "qwen2", "llama"];

    /// Parses a `model_type`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "qwen3" => Some(Family::Qwen3),
            "qwen2" => Some(Family::Qwen2),
            "llama" => Some(Family::Llama),
            _ => None,
        }
    }

    /// The `model_type` string.
    pub fn name(self) -> &'static str {
        match self {
            Family::Qwen3 => "qwen3",
            Family::Qwen2 => "qwen2",
            Family::Llama => "llama",
        }
    }
}

/// A rope scaling this crate implements (HF `rope_scaling` / `rope_parameters`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "rope_type", rename_all = "lowercase")]
pub enum RopeScaling {
    /// Every frequency divided by `factor`.
    Linear {
        /// Position interpolation factor.
        factor: f64,
    },
    /// Llama 3.1's: low frequencies divided by `factor`, high ones kept, a smooth blend between.
    Llama3 {
        /// Scale of the low frequencies.
        factor: f64,
        /// Wavelengths above `original_max_position_embeddings / low_freq_factor` are scaled.
        low_freq_factor: f64,
        /// Wavelengths below `original_max_position_embeddings / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// The context the model was pre-trained with.
        original_max_position_embeddings: f64,
    },
}

impl RopeScaling {
    /// The scaling an HF rope object describes (`rope_type` or the older `type`); `None` for
    /// `default`. Unknown types and missing or non-physical parameters are errors naming them.
    fn parse(v: &Value) -> std::result::Result<Option<Self>, String> {
        let Some(obj) = v.as_object() else {
            return Err(format!("rope_scaling must be an object or null, got {v}"));
        };
        let kind = obj.get("rope_type").or_else(|| obj.get("type")).and_then(Value::as_str).unwrap_or("default");
        let num = |key: &str| -> std::result::Result<f64, String> {
            let x = obj
                .get(key)
                .and_then(Value::as_f64)
                .ok_or_else(|| format!("rope_scaling of type {kind:?} needs a number {key:?}"))?;
            if x.is_finite() && x > 0.0 { Ok(x) } else { Err(format!("rope_scaling.{key} must be > 0, got {x}")) }
        };
        match kind {
            "default" => Ok(None),
            "linear" => Ok(Some(RopeScaling::Linear { factor: num("factor")? })),
            "llama3" => {
                let (low, high) = (num("low_freq_factor")?, num("high_freq_factor")?);
                if high <= low {
                    return Err(format!("rope_scaling.high_freq_factor ({high}) must exceed low_freq_factor ({low})"));
                }
                Ok(Some(RopeScaling::Llama3 {
                    factor: num("factor")?,
                    low_freq_factor: low,
                    high_freq_factor: high,
                    original_max_position_embeddings: num("original_max_position_embeddings")?,
                }))
            }
            other => Err(format!("rope scaling type {other:?} is not supported (supported: default, linear, llama3)")),
        }
    }

    /// Applies the scaling to the unscaled inverse frequencies, as transformers does.
    fn apply(&self, inv: &mut [f64]) {
        match *self {
            RopeScaling::Linear { factor } => inv.iter_mut().for_each(|f| *f /= factor),
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
                let old = original_max_position_embeddings;
                let (low_wavelen, high_wavelen) = (old / low_freq_factor, old / high_freq_factor);
                for f in inv.iter_mut() {
                    let wavelen = 2.0 * std::f64::consts::PI / *f;
                    if wavelen > low_wavelen {
                        *f /= factor;
                    } else if wavelen >= high_wavelen {
                        let smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                        *f = (1.0 - smooth) * *f / factor + smooth * *f;
                    }
                }
            }
        }
    }
}

/// Hyper-parameters of a decoder, as in HF `config.json`. Read through [`RawConfig`], which
/// fills each family's defaults (`head_dim`, `rope_theta` from `rope_parameters`) and refuses
/// what this crate does not compute (sliding windows, MLP biases, other activations).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawConfig")]
pub struct ModelConfig {
    /// The architecture (`model_type`).
    #[serde(rename = "model_type")]
    pub family: Family,
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: usize,
    /// Model width.
    pub hidden_size: usize,
    /// MLP width.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention).
    pub num_key_value_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Longest supported sequence.
    pub max_position_embeddings: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// Rotary base.
    pub rope_theta: f64,
    /// Rotary frequency scaling (written in HF's `rope_scaling` form).
    pub rope_scaling: Option<RopeScaling>,
    /// The output projection is the embedding.
    pub tie_word_embeddings: bool,
    /// Biases on the q/k/v/o projections (Qwen3, Llama; Qwen2 always has q/k/v biases).
    pub attention_bias: bool,
    /// Beginning-of-sequence id.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence id(s) (HF allows a number or a list).
    pub eos_token_id: Option<Value>,
    /// Every other key of the file, kept so a saved config round-trips.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// `config.json` as written, before family defaults.
#[derive(Deserialize)]
struct RawConfig {
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    max_position_embeddings: usize,
    rms_norm_eps: f64,
    rope_theta: Option<f64>,
    rope_scaling: Option<Value>,
    rope_parameters: Option<Value>,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    bos_token_id: Option<u32>,
    #[serde(default)]
    eos_token_id: Option<Value>,
    #[serde(flatten)]
    extra: BTreeMap<String, Value>,
}

impl TryFrom<RawConfig> for ModelConfig {
    type Error = String;

    fn try_from(raw: RawConfig) -> std::result::Result<Self, String> {
        let model_type = raw
            .model_type
            .ok_or_else(|| format!("missing field `model_type` (one of {})", Family::NAMES.join(", ")))?;
        let family = Family::parse(&model_type).ok_or_else(|| {
            format!("model_type {model_type:?} is not supported (supported: {})", Family::NAMES.join(", "))
        })?;
        let extra = raw.extra;
        refuse_unsupported(&extra)?;
        if raw.num_attention_heads == 0 {
            return Err(String::from("num_attention_heads must be positive"));
        }
        // transformers' defaults: Qwen3Config has head_dim = 128, the others hidden / heads.
        let head_dim = match (raw.head_dim, family) {
            (Some(d), _) => d,
            (None, Family::Qwen3) => 128,
            (None, _) => {
                if !raw.hidden_size.is_multiple_of(raw.num_attention_heads) {
                    return Err(format!(
                        "no head_dim, and hidden_size ({}) is not a multiple of num_attention_heads ({})",
                        raw.hidden_size, raw.num_attention_heads
                    ));
                }
                raw.hidden_size / raw.num_attention_heads
            }
        };
        // transformers >= 5 writes `rope_parameters` (theta inside); older files `rope_theta`
        // and `rope_scaling`.
        let params = raw.rope_parameters.filter(|v| !v.is_null());
        let theta_in_params = params.as_ref().and_then(|p| p.get("rope_theta")).and_then(Value::as_f64);
        let rope_theta = raw.rope_theta.or(theta_in_params).unwrap_or(10_000.0);
        let rope_scaling = match params.as_ref().or(raw.rope_scaling.as_ref().filter(|v| !v.is_null())) {
            Some(v) => RopeScaling::parse(v)?,
            None => None,
        };
        let cfg = ModelConfig {
            family,
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_hidden_layers: raw.num_hidden_layers,
            num_attention_heads: raw.num_attention_heads,
            num_key_value_heads: raw.num_key_value_heads.unwrap_or(raw.num_attention_heads),
            head_dim,
            max_position_embeddings: raw.max_position_embeddings,
            rms_norm_eps: raw.rms_norm_eps,
            rope_theta,
            rope_scaling,
            tie_word_embeddings: raw.tie_word_embeddings,
            attention_bias: raw.attention_bias,
            bos_token_id: raw.bos_token_id,
            eos_token_id: raw.eos_token_id,
            extra,
        };
        cfg.check()?;
        Ok(cfg)
    }
}

/// Keys whose values change the function in ways this crate does not compute.
fn refuse_unsupported(extra: &BTreeMap<String, Value>) -> std::result::Result<(), String> {
    if let Some(act) = extra.get("hidden_act").filter(|v| !v.is_null() && v.as_str() != Some("silu")) {
        return Err(format!("hidden_act {act} is not supported (only \"silu\")"));
    }
    if extra.get("mlp_bias").and_then(Value::as_bool) == Some(true) {
        return Err(String::from("mlp_bias = true is not supported"));
    }
    if extra.get("use_sliding_window").and_then(Value::as_bool) == Some(true) {
        return Err(String::from("use_sliding_window = true is not supported (sliding-window attention)"));
    }
    let kinds = extra.get("layer_types").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    if let Some(k) = kinds.iter().find(|k| k.as_str() != Some("full_attention")) {
        return Err(format!("layer_types entry {k} is not supported (only \"full_attention\")"));
    }
    Ok(())
}

/// Named model sizes for `rl model init`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// hidden 128, 4 layers, 4/2 heads of 32, MLP 384, tied embeddings (~0.8M params).
    Tiny,
    /// hidden 256, 6 layers, 8/4 heads of 32, MLP 768, tied embeddings (~4.8M params).
    Small,
    /// Qwen3-0.6B's shapes (hidden 1024, 28 layers, 16/8 heads of 128, MLP 3072, vocabulary
    /// 151936, tied embeddings, RoPE theta 1e6, 40960 positions; ~0.6B params) with random
    /// weights: the GPU benchmark's model.
    Qwen3_0_6B,
}

impl Preset {
    /// Every preset's name, as [`Preset::parse`] takes them.
    pub const NAMES: &[&str] = &["tiny", "small", "qwen3-0.6b"];

    /// Parses `tiny`, `small` or `qwen3-0.6b`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "tiny" => Some(Preset::Tiny),
            "small" => Some(Preset::Small),
            "qwen3-0.6b" => Some(Preset::Qwen3_0_6B),
            _ => None,
        }
    }

    /// The vocabulary this preset fixes (Qwen3-0.6B's), whatever its tokenizer covers.
    pub fn vocab_size(self) -> Option<usize> {
        match self {
            Preset::Qwen3_0_6B => Some(151_936),
            Preset::Tiny | Preset::Small => None,
        }
    }
}

impl ModelConfig {
    /// The config of a preset for a vocabulary of `vocab_size`.
    pub fn preset(preset: Preset, vocab_size: usize) -> Self {
        let (hidden, layers, heads, kv, inter) = match preset {
            Preset::Tiny => (128, 4, 4, 2, 384),
            Preset::Small => (256, 6, 8, 4, 768),
            Preset::Qwen3_0_6B => (1024, 28, 16, 8, 3072),
        };
        let (head_dim, max_positions, rope_theta) = match preset {
            Preset::Qwen3_0_6B => (128, 40_960, 1_000_000.0),
            Preset::Tiny | Preset::Small => (32, 2048, 10_000.0),
        };
        let mut extra = BTreeMap::new();
        for (k, v) in [
            ("architectures", serde_json::json!(["Qwen3ForCausalLM"])),
            ("hidden_act", serde_json::json!("silu")),
            ("torch_dtype", serde_json::json!("float32")),
            ("attention_dropout", serde_json::json!(0.0)),
            ("initializer_range", serde_json::json!(0.02)),
            ("use_cache", serde_json::json!(true)),
            ("use_sliding_window", serde_json::json!(false)),
            ("sliding_window", serde_json::Value::Null),
            ("max_window_layers", serde_json::json!(layers)),
        ] {
            extra.insert(k.to_owned(), v);
        }
        ModelConfig {
            family: Family::Qwen3,
            vocab_size,
            hidden_size: hidden,
            intermediate_size: inter,
            num_hidden_layers: layers,
            num_attention_heads: heads,
            num_key_value_heads: kv,
            head_dim,
            max_position_embeddings: max_positions,
            rms_norm_eps: 1e-6,
            rope_theta,
            rope_scaling: None,
            tie_word_embeddings: true,
            attention_bias: false,
            bos_token_id: None,
            eos_token_id: None,
            extra,
        }
    }

    /// Reads `config.json`.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        // Deserialising runs `check` (through `RawConfig`).
        serde_json::from_str(&text)
            .map_err(|e| Error::bad_dir(path.parent().unwrap_or(path), format!("config.json: {e}")))
    }

    /// Checks the shape relations the model relies on.
    pub fn check(&self) -> std::result::Result<(), String> {
        if self.num_key_value_heads == 0 || !self.num_attention_heads.is_multiple_of(self.num_key_value_heads) {
            return Err(format!(
                "num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(format!("head_dim ({}) must be even for rotary embeddings", self.head_dim));
        }
        let sizes = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return Err(format!("{name} must be positive"));
        }
        // Values that load fine but make every logit NaN or meaningless: refuse them here.
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0 && self.rms_norm_eps < 1.0) {
            return Err(format!("rms_norm_eps must be in (0, 1), got {}", self.rms_norm_eps));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 1.0) {
            return Err(format!("rope_theta must be a finite number > 1, got {}", self.rope_theta));
        }
        if let Some(id) = self.bos_token_id.filter(|id| *id as usize >= self.vocab_size) {
            return Err(format!("bos_token_id ({id}) must be below vocab_size ({})", self.vocab_size));
        }
        Ok(())
    }

    /// Whether the q, k and v projections have biases (Qwen2 always; the others with
    /// `attention_bias`).
    pub fn qkv_bias(&self) -> bool {
        self.family == Family::Qwen2 || self.attention_bias
    }

    /// Whether the output projection has a bias (`attention_bias`, except in Qwen2, which
    /// ignores it).
    pub fn o_bias(&self) -> bool {
        self.family != Family::Qwen2 && self.attention_bias
    }

    /// Whether every q/k head is RMS-normalised before RoPE (Qwen3).
    pub fn qk_norm(&self) -> bool {
        self.family == Family::Qwen3
    }

    /// The rotary inverse frequencies (`head_dim / 2`), after the rope scaling.
    pub fn inv_freq(&self) -> Vec<f64> {
        let d = self.head_dim as f64;
        let mut inv: Vec<f64> =
            (0..self.head_dim / 2).map(|i| 1.0 / self.rope_theta.powf(2.0 * i as f64 / d)).collect();
        if let Some(scaling) = &self.rope_scaling {
            scaling.apply(&mut inv);
        }
        inv
    }
}

#[cfg(test)]
mod tests {
    use super::{Family, ModelConfig, Preset, RopeScaling};

    fn parse(v: serde_json::Value) -> Result<ModelConfig, String> {
        serde_json::from_value(v).map_err(|e| e.to_string())
    }

    /// The keys every test config shares, then `more` on top.
    #[allow(clippy::needless_pass_by_value)] // reads as `config(json!(..))`
    fn config(more: serde_json::Value) -> serde_json::Value {
        let mut v = serde_json::json!({
            "vocab_size": 40, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 64,
            "rms_norm_eps": 1e-6, "hidden_act": "silu",
        });
        v.as_object_mut().unwrap().extend(more.as_object().unwrap().clone());
        v
    }

    #[test]
    fn each_family_reads_as_transformers_writes_it() {
        // transformers 5 (Qwen2Config().to_json_string()): no head_dim, theta in rope_parameters.
        let qwen2 = parse(config(serde_json::json!({
            "model_type": "qwen2", "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"},
            "use_sliding_window": false, "sliding_window": null,
            "layer_types": ["full_attention", "full_attention"],
        })))
        .unwrap();
        assert_eq!(
            (qwen2.family, qwen2.head_dim, qwen2.rope_theta, qwen2.rope_scaling.is_none()),
            (Family::Qwen2, 8, 1e6, true)
        );
        assert!(qwen2.qkv_bias() && !qwen2.o_bias() && !qwen2.qk_norm());
        // Llama 3.1 as on the Hub (rope_theta + rope_scaling) and as transformers 5 writes it.
        let scaling = serde_json::json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16});
        let old =
            parse(config(serde_json::json!({"model_type": "llama", "rope_theta": 10000.0, "rope_scaling": scaling})))
                .unwrap();
        let mut params = scaling;
        params["rope_theta"] = serde_json::json!(10000.0);
        let new = parse(config(serde_json::json!({"model_type": "llama", "rope_parameters": params}))).unwrap();
        assert_eq!(old, new);
        assert!(matches!(new.rope_scaling, Some(RopeScaling::Llama3 { factor: 8.0, .. })));
        assert!(!new.qkv_bias() && !new.qk_norm());
        // transformers' `_compute_llama3_parameters` for this config (head_dim 8): all three bands.
        let want = [0.576_056_361_198_425_3, 0.012_5, 0.001_25, 0.000_125];
        for (got, want) in new.inv_freq().iter().zip(want) {
            assert!((got - want).abs() < 1e-7 * want.max(1e-3), "{got} vs {want}");
        }
        // Written back in the Hub's form and read again: the same config.
        assert_eq!(parse(serde_json::to_value(&new).unwrap()).unwrap(), new);
        // Qwen3 without head_dim takes transformers' default (128).
        let qwen3 = parse(config(serde_json::json!({"model_type": "qwen3", "num_attention_heads": 2}))).unwrap();
        assert_eq!((qwen3.head_dim, qwen3.rope_theta), (128, 10_000.0));
        assert!(qwen3.qk_norm());
    }

    #[test]
    fn what_is_not_computed_is_refused_naming_it() {
        let cases = [
            (serde_json::json!({}), "missing field `model_type`"),
            (serde_json::json!({"model_type": "mistral"}), "model_type \"mistral\" is not supported"),
            (
                serde_json::json!({"model_type": "llama", "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}),
                "\"yarn\" is not supported",
            ),
            (
                serde_json::json!({"model_type": "llama", "rope_scaling": {"type": "dynamic", "factor": 4.0}}),
                "\"dynamic\" is not supported",
            ),
            (
                serde_json::json!({"model_type": "llama", "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}),
                "needs a number \"low_freq_factor\"",
            ),
            (
                serde_json::json!({"model_type": "llama", "rope_scaling": {"rope_type": "linear", "factor": -2.0}}),
                "rope_scaling.factor must be > 0",
            ),
            (serde_json::json!({"model_type": "qwen2", "use_sliding_window": true}), "use_sliding_window"),
            (serde_json::json!({"model_type": "qwen2", "layer_types": ["sliding_attention"]}), "layer_types"),
            (serde_json::json!({"model_type": "llama", "mlp_bias": true}), "mlp_bias"),
            (serde_json::json!({"model_type": "llama", "hidden_act": "gelu"}), "hidden_act"),
            (serde_json::json!({"model_type": "llama", "hidden_size": 15}), "not a multiple of num_attention_heads"),
        ];
        for (more, want) in cases {
            let e = parse(config(more.clone())).expect_err(want);
            assert!(e.contains(want), "{more}: {e}");
        }
    }

    #[test]
    fn the_qwen3_0_6b_preset_has_its_shapes_and_parameter_count() {
        for name in Preset::NAMES {
            assert!(Preset::parse(name).is_some(), "{name}");
        }
        let p = Preset::parse("qwen3-0.6b").unwrap();
        let c = ModelConfig::preset(p, p.vocab_size().unwrap());
        c.check().unwrap();
        let (h, q, kv) = (c.hidden_size, c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim);
        let layer = 2 * h * q + 2 * h * kv + 3 * h * c.intermediate_size + 2 * h + 2 * c.head_dim;
        let params = c.vocab_size * h + c.num_hidden_layers * layer + h;
        // Qwen3-0.6B: 0.60B parameters, 0.44B of them outside the embedding.
        assert!((590_000_000..600_000_000).contains(&params), "{params}");
        assert!((430_000_000..450_000_000).contains(&(params - c.vocab_size * h)), "{params}");
        assert_eq!((c.head_dim, c.max_position_embeddings, c.rope_theta), (128, 40_960, 1e6));
    }

    #[test]
    fn non_physical_values_are_refused_naming_the_field() {
        let good = ModelConfig::preset(Preset::Tiny, 64);
        good.check().unwrap();
        type Tweak = fn(&mut ModelConfig);
        let cases: [(&str, Tweak); 7] = [
            ("rope_theta", |c| c.rope_theta = -10_000.0),
            ("rope_theta", |c| c.rope_theta = f64::INFINITY),
            ("rms_norm_eps", |c| c.rms_norm_eps = -1e-6),
            ("rms_norm_eps", |c| c.rms_norm_eps = 0.0),
            ("intermediate_size", |c| c.intermediate_size = 0),
            ("max_position_embeddings", |c| c.max_position_embeddings = 0),
            ("bos_token_id", |c| c.bos_token_id = Some(64)),
        ];
        for (field, tweak) in cases {
            let mut c = good.clone();
            tweak(&mut c);
            let e = c.check().expect_err(field);
            assert!(e.contains(field), "{e}");
        }
    }
}
