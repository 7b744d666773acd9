//! The Qwen3 architecture's `config.json` (HF names), and the `tiny` and `small` presets.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Hyper-parameters of a Qwen3 decoder, as in HF `config.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Qwen3Config {
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
    /// The output projection is the embedding.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Biases on q/k/v/o projections (false for Qwen3).
    #[serde(default)]
    pub attention_bias: bool,
    /// Beginning-of-sequence id.
    #[serde(default)]
    pub bos_token_id: Option<u32>,
    /// End-of-sequence id(s) (HF allows a number or a list).
    #[serde(default)]
    pub eos_token_id: Option<serde_json::Value>,
    /// Every other key of the file, kept so a saved config round-trips.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
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

impl Qwen3Config {
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
            ("model_type", serde_json::json!("qwen3")),
            ("hidden_act", serde_json::json!("silu")),
            ("torch_dtype", serde_json::json!("float32")),
            ("attention_dropout", serde_json::json!(0.0)),
            ("initializer_range", serde_json::json!(0.02)),
            ("use_cache", serde_json::json!(true)),
            ("use_sliding_window", serde_json::json!(false)),
            ("sliding_window", serde_json::Value::Null),
            ("max_window_layers", serde_json::json!(layers)),
            ("rope_scaling", serde_json::Value::Null),
        ] {
            extra.insert(k.to_owned(), v);
        }
        Qwen3Config {
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
        let cfg: Qwen3Config = serde_json::from_str(&text)
            .map_err(|e| Error::bad_dir(path.parent().unwrap_or(path), format!("config.json: {e}")))?;
        cfg.check().map_err(|m| Error::bad_dir(path.parent().unwrap_or(path), format!("config.json: {m}")))?;
        Ok(cfg)
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
        if self.attention_bias {
            return Err(String::from("attention_bias = true is not supported (Qwen3 has no attention biases)"));
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

    /// Number of parameters.
    pub fn num_params(&self) -> usize {
        let h = self.hidden_size;
        let q = self.num_attention_heads * self.head_dim;
        let kv = self.num_key_value_heads * self.head_dim;
        let layer = h * q + 2 * h * kv + q * h + 2 * self.head_dim + 3 * h * self.intermediate_size + 2 * h;
        let head = if self.tie_word_embeddings { 0 } else { self.vocab_size * h };
        self.vocab_size * h + self.num_hidden_layers * layer + h + head
    }
}

#[cfg(test)]
mod tests {
    use super::{Preset, Qwen3Config};

    #[test]
    fn the_qwen3_0_6b_preset_has_its_shapes_and_parameter_count() {
        for name in Preset::NAMES {
            assert!(Preset::parse(name).is_some(), "{name}");
        }
        let p = Preset::parse("qwen3-0.6b").unwrap();
        let c = Qwen3Config::preset(p, p.vocab_size().unwrap());
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
        let good = Qwen3Config::preset(Preset::Tiny, 64);
        good.check().unwrap();
        type Tweak = fn(&mut Qwen3Config);
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
