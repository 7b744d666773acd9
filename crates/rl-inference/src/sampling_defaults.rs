//! The sampling fields a request leaves out, filled from the model's `generation_config.json` as
//! vLLM does by default (`--generation-config auto`): `temperature`, `top_p`, `top_k`, `min_p`,
//! `repetition_penalty` and `max_new_tokens` (as `max_tokens`), each only where it differs from
//! transformers' `GenerationConfig` default (vLLM reads the file's `to_diff_dict()`, so a stated
//! `top_k: 50` or `temperature: 1.0` changes nothing there either).

use std::path::Path;

use rl_configs::GenerationConfigSource;
use serde_json::Value;

use crate::error::{Error, Result};

/// Per-field defaults for requests; `None`: the neutral default.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct SamplingDefaults {
    pub(crate) temperature: Option<f64>,
    pub(crate) top_p: Option<f32>,
    pub(crate) top_k: Option<i64>,
    pub(crate) min_p: Option<f32>,
    pub(crate) repetition_penalty: Option<f32>,
    pub(crate) max_tokens: Option<u32>,
}

impl SamplingDefaults {
    /// The defaults of `source` for the model in `dir` (its base's directory for an adapter).
    pub(crate) fn load(source: Option<GenerationConfigSource>, dir: &Path) -> Result<Self> {
        if source == Some(GenerationConfigSource::Vllm) {
            return Ok(SamplingDefaults::default());
        }
        let path = dir.join("generation_config.json");
        let Ok(text) = std::fs::read_to_string(&path) else { return Ok(SamplingDefaults::default()) };
        let bad = |m: String| Error::BadRequest(format!("{}: {m}", path.display()));
        let config: Value = serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let defaults = Self::from_json(&config).map_err(bad)?;
        if defaults != SamplingDefaults::default() {
            tracing::warn!(
                ?defaults,
                "default sampling parameters come from the model's generation_config.json (as vLLM's \
                 --generation-config auto); set inference.generation_config = \"vllm\" for neutral ones"
            );
        }
        Ok(defaults)
    }

    /// The fields of a `generation_config.json` that differ from transformers' defaults.
    fn from_json(config: &Value) -> std::result::Result<Self, String> {
        let number = |key: &str, hf_default: Option<f64>| -> std::result::Result<Option<f64>, String> {
            match config.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => {
                    let x = v.as_f64().ok_or_else(|| format!("`{key}` must be a number, got {v}"))?;
                    Ok(Some(x).filter(|x| Some(*x) != hf_default))
                }
            }
        };
        let whole = |x: f64, key: &str| -> std::result::Result<i64, String> {
            if x.fract() == 0.0 { Ok(x as i64) } else { Err(format!("`{key}` must be a whole number, got {x}")) }
        };
        Ok(SamplingDefaults {
            temperature: number("temperature", Some(1.0))?,
            top_p: number("top_p", Some(1.0))?.map(|x| x as f32),
            top_k: number("top_k", Some(50.0))?.map(|x| whole(x, "top_k")).transpose()?,
            min_p: number("min_p", None)?.map(|x| x as f32),
            repetition_penalty: number("repetition_penalty", Some(1.0))?.map(|x| x as f32),
            max_tokens: number("max_new_tokens", None)?
                .map(|x| whole(x, "max_new_tokens").and_then(|n| u32::try_from(n).map_err(|e| e.to_string())))
                .transpose()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn only_fields_that_differ_from_transformers_defaults_count() {
        // Qwen3's generation_config.json.
        let qwen3 = json!({"bos_token_id": 151643, "do_sample": true, "eos_token_id": [151645, 151643],
                           "pad_token_id": 151643, "temperature": 0.6, "top_k": 20, "top_p": 0.95});
        let d = SamplingDefaults::from_json(&qwen3).unwrap();
        assert_eq!((d.temperature, d.top_p, d.top_k), (Some(0.6), Some(0.95), Some(20)));
        assert_eq!((d.min_p, d.repetition_penalty, d.max_tokens), (None, None, None));
        let stated_defaults = json!({"temperature": 1.0, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.0});
        assert_eq!(SamplingDefaults::from_json(&stated_defaults).unwrap(), SamplingDefaults::default());
        let more = json!({"min_p": 0.05, "repetition_penalty": 1.1, "max_new_tokens": 256});
        let d = SamplingDefaults::from_json(&more).unwrap();
        assert_eq!((d.min_p, d.repetition_penalty, d.max_tokens), (Some(0.05), Some(1.1), Some(256)));
        assert!(SamplingDefaults::from_json(&json!({"top_k": "20"})).unwrap_err().contains("`top_k`"));
        assert!(SamplingDefaults::from_json(&json!({"max_new_tokens": 2.5})).unwrap_err().contains("whole"));
    }

    #[test]
    fn vllm_or_no_file_is_neutral_and_a_broken_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(SamplingDefaults::load(None, dir.path()).unwrap(), SamplingDefaults::default());
        std::fs::write(dir.path().join("generation_config.json"), r#"{"top_k": 20}"#).unwrap();
        assert_eq!(SamplingDefaults::load(None, dir.path()).unwrap().top_k, Some(20));
        let vllm = SamplingDefaults::load(Some(GenerationConfigSource::Vllm), dir.path()).unwrap();
        assert_eq!(vllm, SamplingDefaults::default());
        std::fs::write(dir.path().join("generation_config.json"), "{").unwrap();
        let err = SamplingDefaults::load(Some(GenerationConfigSource::Auto), dir.path()).unwrap_err().to_string();
        assert!(err.contains("generation_config.json: not valid JSON"), "{err}");
    }
}
