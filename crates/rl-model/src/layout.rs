//! The HF weight layout of the three families, its one owner: every weight's name and shape, which
//! family has which, the order the fused layer op's flat buffer holds a layer in, and the kernels'
//! `LayerShape` of a config. The loader, the model, LoRA and `rl model init` read it from here.

use rl_kernels::{AttnShape, LayerShape, Proj};

use crate::config::ModelConfig;

/// The token embedding `[vocab, hidden]`.
pub const EMBED: &str = "model.embed_tokens.weight";
/// The final norm `[hidden]`.
pub const FINAL_NORM: &str = "model.norm.weight";
/// The output head `[vocab, hidden]` (absent with tied embeddings).
pub const LM_HEAD: &str = "lm_head.weight";

/// One weight of a decoder layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerWeight {
    /// `input_layernorm`.
    InputNorm,
    /// The q, k, v projections.
    Q,
    K,
    V,
    /// Their biases (Qwen2; Llama's `attention_bias`).
    QBias,
    KBias,
    VBias,
    /// Per-head q/k RMSNorm (Qwen3).
    QNorm,
    KNorm,
    /// The output projection and its bias (Llama's `attention_bias`).
    O,
    OBias,
    /// `post_attention_layernorm`.
    PostNorm,
    /// The MLP.
    Gate,
    Up,
    Down,
}

impl LayerWeight {
    /// The fused layer op's flat order (`rl_kernels::LayerShape::parts`).
    pub const FUSED_ORDER: [LayerWeight; 15] = {
        use LayerWeight::*;
        [InputNorm, Q, K, V, QBias, KBias, VBias, QNorm, KNorm, O, OBias, PostNorm, Gate, Up, Down]
    };

    /// The order of [`weight_shapes`]: `rl model init` draws random weights in it, so changing it
    /// changes every seeded model.
    const INIT_ORDER: [LayerWeight; 15] = {
        use LayerWeight::*;
        [Q, QBias, K, KBias, V, VBias, O, OBias, QNorm, KNorm, Gate, Up, Down, InputNorm, PostNorm]
    };

    /// The weight's name inside layer `i`'s prefix (`self_attn.q_proj.weight`).
    pub fn suffix(self) -> &'static str {
        use LayerWeight::*;
        match self {
            InputNorm => "input_layernorm.weight",
            Q => "self_attn.q_proj.weight",
            K => "self_attn.k_proj.weight",
            V => "self_attn.v_proj.weight",
            QBias => "self_attn.q_proj.bias",
            KBias => "self_attn.k_proj.bias",
            VBias => "self_attn.v_proj.bias",
            QNorm => "self_attn.q_norm.weight",
            KNorm => "self_attn.k_norm.weight",
            O => "self_attn.o_proj.weight",
            OBias => "self_attn.o_proj.bias",
            PostNorm => "post_attention_layernorm.weight",
            Gate => "mlp.gate_proj.weight",
            Up => "mlp.up_proj.weight",
            Down => "mlp.down_proj.weight",
        }
    }

    /// The HF name in layer `i` (`model.layers.3.self_attn.q_proj.weight`).
    pub fn name(self, i: usize) -> String {
        format!("model.layers.{i}.{}", self.suffix())
    }

    /// Whether `cfg`'s family has this weight.
    pub fn present(self, cfg: &ModelConfig) -> bool {
        use LayerWeight::*;
        match self {
            QBias | KBias | VBias => cfg.qkv_bias(),
            QNorm | KNorm => cfg.qk_norm(),
            OBias => cfg.o_bias(),
            _ => true,
        }
    }

    /// The weight's shape under `cfg`.
    pub fn shape(self, cfg: &ModelConfig) -> Vec<usize> {
        use LayerWeight::*;
        let (h, hd, inter) = (cfg.hidden_size, cfg.head_dim, cfg.intermediate_size);
        let (q, kv) = (cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd);
        match self {
            InputNorm | PostNorm | OBias => vec![h],
            Q => vec![q, h],
            K | V => vec![kv, h],
            QBias => vec![q],
            KBias | VBias => vec![kv],
            QNorm | KNorm => vec![hd],
            O => vec![h, q],
            Gate | Up => vec![inter, h],
            Down => vec![h, inter],
        }
    }

    /// The projection weight LoRA adapts as `p`.
    pub fn of_proj(p: Proj) -> LayerWeight {
        match p {
            Proj::Q => LayerWeight::Q,
            Proj::K => LayerWeight::K,
            Proj::V => LayerWeight::V,
            Proj::O => LayerWeight::O,
            Proj::Gate => LayerWeight::Gate,
            Proj::Up => LayerWeight::Up,
            Proj::Down => LayerWeight::Down,
        }
    }
}

/// The HF path of a projection module of layer `i` (`model.layers.3.self_attn.q_proj`), as PEFT
/// names its adapters' modules.
pub fn module_path(i: usize, p: Proj) -> String {
    let name = LayerWeight::of_proj(p).name(i);
    name.strip_suffix(".weight").map(str::to_owned).unwrap_or(name)
}

fn layer_in(cfg: &ModelConfig, i: usize, order: &[LayerWeight]) -> Vec<(String, Vec<usize>)> {
    order.iter().filter(|w| w.present(cfg)).map(|w| (w.name(i), w.shape(cfg))).collect()
}

/// One decoder layer's weights (HF names and shapes) in the fused layer op's flat order.
pub fn layer_part_shapes(cfg: &ModelConfig, i: usize) -> Vec<(String, Vec<usize>)> {
    layer_in(cfg, i, &LayerWeight::FUSED_ORDER)
}

/// The HF name and shape of every weight the model reads, in a stable order.
pub fn weight_shapes(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let (h, vocab) = (cfg.hidden_size, cfg.vocab_size);
    let mut out = vec![(EMBED.to_owned(), vec![vocab, h])];
    for i in 0..cfg.num_hidden_layers {
        out.extend(layer_in(cfg, i, &LayerWeight::INIT_ORDER));
    }
    out.push((FINAL_NORM.to_owned(), vec![h]));
    if !cfg.tie_word_embeddings {
        out.push((LM_HEAD.to_owned(), vec![vocab, h]));
    }
    out
}

/// The HF names of every weight the model reads, in [`weight_shapes`] order.
pub fn weight_names(cfg: &ModelConfig) -> Vec<String> {
    weight_shapes(cfg).into_iter().map(|(name, _)| name).collect()
}

/// The fused layer's shape of `cfg`'s decoder layers.
pub fn layer_shape(cfg: &ModelConfig) -> LayerShape {
    LayerShape {
        hidden: cfg.hidden_size,
        attn: AttnShape { q_heads: cfg.num_attention_heads, kv_heads: cfg.num_key_value_heads, head_dim: cfg.head_dim },
        intermediate: cfg.intermediate_size,
        eps: cfg.rms_norm_eps,
        qkv_bias: cfg.qkv_bias(),
        qk_norm: cfg.qk_norm(),
        o_bias: cfg.o_bias(),
    }
}

impl ModelConfig {
    /// Number of parameters.
    pub fn num_params(&self) -> usize {
        weight_shapes(self).iter().map(|(_, shape)| shape.iter().product::<usize>()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Family, Preset};

    #[test]
    fn the_fused_order_matches_the_kernels_flat_layout_for_every_family() {
        for family in [Family::Qwen3, Family::Qwen2, Family::Llama] {
            let mut cfg = ModelConfig::preset(Preset::Tiny, 64);
            cfg.family = family;
            cfg.attention_bias = true;
            let sh = layer_shape(&cfg);
            let parts = sh.parts();
            let ranges = [
                &parts.ln1,
                &parts.qkv,
                &parts.qkv_bias,
                &parts.q_norm,
                &parts.k_norm,
                &parts.o,
                &parts.o_bias,
                &parts.ln2,
                &parts.gate_up,
                &parts.down,
            ];
            let lens: Vec<usize> = ranges.iter().map(|r| r.len()).filter(|&n| n > 0).collect();
            // Our parts, with q/k/v (and their biases, and gate/up) summed as the kernel stacks them.
            let mut ours: Vec<usize> = Vec::new();
            let mut last: Option<&str> = None;
            for (name, shape) in layer_part_shapes(&cfg, 0) {
                let n: usize = shape.iter().product();
                let group = if name.contains("_proj.bias") && !name.contains("o_proj") {
                    "qkv_bias"
                } else if ["q_proj.weight", "k_proj.weight", "v_proj.weight"].iter().any(|s| name.ends_with(s)) {
                    "qkv"
                } else if name.ends_with("gate_proj.weight") || name.ends_with("up_proj.weight") {
                    "gate_up"
                } else {
                    "single"
                };
                match (last, ours.last_mut()) {
                    (Some(l), Some(total)) if l == group && group != "single" => *total += n,
                    _ => ours.push(n),
                }
                last = Some(group);
            }
            assert_eq!(ours, lens, "{family:?}");
            assert_eq!(sh.weight_len(), lens.iter().sum::<usize>());
        }
    }

    #[test]
    fn every_weight_is_named_once_and_counted() {
        let mut cfg = ModelConfig::preset(Preset::Small, 64);
        cfg.tie_word_embeddings = false;
        let names = weight_names(&cfg);
        let unique: std::collections::BTreeSet<&String> = names.iter().collect();
        assert_eq!(unique.len(), names.len());
        let fused: usize = (0..cfg.num_hidden_layers).map(|i| layer_part_shapes(&cfg, i).len()).sum();
        assert_eq!(names.len(), fused + 2 + usize::from(!cfg.tie_word_embeddings));
        assert!(cfg.num_params() > 0);
    }
}
