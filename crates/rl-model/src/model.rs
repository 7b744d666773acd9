//! The Qwen3 decoder as a differentiable candle graph, for training (and scoring): one packed row
//! at a time, laid out by a [`RowLayout`] (independent samples, or completions sharing a prompt).
//! Every non-matmul step is a fused op of `rl-kernels` with a real backward pass. Weights are read
//! through a `VarBuilder` under the HF tensor names, so the same code runs on trainable `Var`s or
//! plain tensors. Generation runs on [`crate::runtime`], which computes the same function.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use rl_kernels::ops::{Rope, attention, head_norm_rope, rms_norm, swiglu};
use rl_kernels::{AttnShape, RowLayout};

use crate::config::Qwen3Config;
use crate::error::{Error, Result};

/// One decoder layer's weights (HF layout: projections are `[out, in]`).
#[derive(Debug, Clone)]
pub(crate) struct Layer {
    pub(crate) q: Tensor,
    pub(crate) k: Tensor,
    pub(crate) v: Tensor,
    pub(crate) o: Tensor,
    pub(crate) q_norm: Tensor,
    pub(crate) k_norm: Tensor,
    pub(crate) gate: Tensor,
    pub(crate) up: Tensor,
    pub(crate) down: Tensor,
    pub(crate) ln1: Tensor,
    pub(crate) ln2: Tensor,
}

/// A Qwen3 causal language model.
#[derive(Debug, Clone)]
pub struct Qwen3 {
    cfg: Qwen3Config,
    pub(crate) embed: Tensor,
    pub(crate) layers: Vec<Layer>,
    pub(crate) norm: Tensor,
    pub(crate) lm_head: Tensor,
    pub(crate) rope: Rope,
    device: Device,
    /// The dtype the forward pass computes in; weights are cast to it at use, so gradients reach
    /// the stored (master) weights in their own dtype.
    compute: DType,
}

/// `x W^T` for `x [T, in]` and an HF weight `W [out, in]`.
fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    Ok(rl_kernels::ops::linear(x, w)?)
}

impl Qwen3 {
    /// Builds the model from weights named as in HF (`model.layers.0.self_attn.q_proj.weight`, ...).
    pub fn new(cfg: &Qwen3Config, vb: &VarBuilder<'_>) -> Result<Self> {
        cfg.check().map_err(Error::Input)?;
        let (h, hd) = (cfg.hidden_size, cfg.head_dim);
        let (q_dim, kv_dim, inter) =
            (cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd, cfg.intermediate_size);
        let m = vb.pp("model");
        let embed = m.get((cfg.vocab_size, h), "embed_tokens.weight")?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let l = m.pp("layers").pp(i.to_string());
            let (a, p) = (l.pp("self_attn"), l.pp("mlp"));
            layers.push(Layer {
                q: a.get((q_dim, h), "q_proj.weight")?,
                k: a.get((kv_dim, h), "k_proj.weight")?,
                v: a.get((kv_dim, h), "v_proj.weight")?,
                o: a.get((h, q_dim), "o_proj.weight")?,
                q_norm: a.get(hd, "q_norm.weight")?,
                k_norm: a.get(hd, "k_norm.weight")?,
                gate: p.get((inter, h), "gate_proj.weight")?,
                up: p.get((inter, h), "up_proj.weight")?,
                down: p.get((h, inter), "down_proj.weight")?,
                ln1: l.get(h, "input_layernorm.weight")?,
                ln2: l.get(h, "post_attention_layernorm.weight")?,
            });
        }
        let norm = m.get(h, "norm.weight")?;
        let lm_head =
            if cfg.tie_word_embeddings { embed.clone() } else { vb.get((cfg.vocab_size, h), "lm_head.weight")? };
        let rope = Rope::new(hd, cfg.rope_theta, cfg.max_position_embeddings, embed.dtype(), vb.device())?;
        let compute = embed.dtype();
        Ok(Qwen3 { cfg: cfg.clone(), embed, layers, norm, lm_head, rope, device: vb.device().clone(), compute })
    }

    /// This model computing in `dtype` (e.g. bf16 over f32 master weights on a GPU).
    pub fn with_compute_dtype(mut self, dtype: DType) -> Self {
        self.compute = dtype;
        self
    }

    /// The dtype the forward pass computes in.
    pub fn compute_dtype(&self) -> DType {
        self.compute
    }

    /// `w` in the compute dtype (differentiable: a no-op when it already is).
    fn at(&self, w: &Tensor) -> Result<Tensor> {
        Ok(w.to_dtype(self.compute)?)
    }

    /// The config.
    pub fn config(&self) -> &Qwen3Config {
        &self.cfg
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    fn shape(&self) -> AttnShape {
        AttnShape {
            q_heads: self.cfg.num_attention_heads,
            kv_heads: self.cfg.num_key_value_heads,
            head_dim: self.cfg.head_dim,
        }
    }

    pub(crate) fn check_ids(&self, ids: &[u32]) -> Result<()> {
        if let Some(bad) = ids.iter().find(|&&i| i as usize >= self.cfg.vocab_size) {
            return Err(Error::Input(format!("token id {bad} is outside the vocabulary of {}", self.cfg.vocab_size)));
        }
        Ok(())
    }

    /// Final-normed hidden states `[T, hidden]` of one packed row (`ids` laid out as `layout`).
    /// Differentiable in every weight.
    pub fn hidden(&self, ids: &[u32], layout: &Arc<RowLayout>) -> Result<Tensor> {
        self.check_ids(ids)?;
        if ids.len() != layout.len() || ids.is_empty() {
            return Err(Error::Input(format!("{} token ids for a layout of {} tokens", ids.len(), layout.len())));
        }
        let positions: Arc<[u32]> = layout.positions().into();
        if let Some(p) = positions.iter().find(|&&p| p as usize >= self.cfg.max_position_embeddings) {
            return Err(Error::Input(format!(
                "position {p} exceeds max_position_embeddings ({})",
                self.cfg.max_position_embeddings
            )));
        }
        let (eps, hd) = (self.cfg.rms_norm_eps, self.cfg.head_dim);
        let scale = 1.0 / (hd as f64).sqrt();
        let mut x = self.at(&self.embed.index_select(&Tensor::new(ids, &self.device)?, 0)?)?;
        for l in &self.layers {
            let h = rms_norm(&x, &self.at(&l.ln1)?, eps)?;
            let q = linear(&h, &self.at(&l.q)?)?;
            let q = head_norm_rope(&q, &self.at(&l.q_norm)?, eps, positions.clone(), &self.rope)?;
            let k = linear(&h, &self.at(&l.k)?)?;
            let k = head_norm_rope(&k, &self.at(&l.k_norm)?, eps, positions.clone(), &self.rope)?;
            let v = linear(&h, &self.at(&l.v)?)?;
            let a = attention(&q, &k, &v, layout.clone(), self.shape(), scale)?;
            x = (x + linear(&a, &self.at(&l.o)?)?)?;
            let h = rms_norm(&x, &self.at(&l.ln2)?, eps)?;
            let mlp = swiglu(&linear(&h, &self.at(&l.gate)?)?, &linear(&h, &self.at(&l.up)?)?)?;
            x = (&x + linear(&mlp, &self.at(&l.down)?)?)?;
        }
        Ok(rms_norm(&x, &self.at(&self.norm)?, eps)?)
    }

    /// Logits `[R, vocab]` of final-normed hidden rows `[R, hidden]`.
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        linear(hidden, &self.at(&self.lm_head)?)
    }

    /// Logits `[B, T, vocab]` for packed rows: `input_ids` and `positions` are `B` rows of `T`;
    /// a sample starts wherever the position does not continue the previous one, and attention
    /// never crosses samples. Differentiable.
    pub fn forward_packed(&self, input_ids: &[Vec<u32>], positions: &[Vec<u32>]) -> Result<Tensor> {
        let t = input_ids.first().map_or(0, Vec::len);
        if positions.len() != input_ids.len() || input_ids.iter().chain(positions).any(|r| r.len() != t) {
            return Err(Error::Input(String::from("input_ids and positions must be rows of equal length")));
        }
        let rows = input_ids
            .iter()
            .zip(positions)
            .map(|(ids, pos)| {
                let layout = Arc::new(RowLayout::from_positions(pos));
                if layout.positions() != *pos {
                    return Err(Error::Input(String::from("positions must restart at 0 for each sample")));
                }
                self.logits(&self.hidden(ids, &layout)?)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Tensor::stack(&rows, 0)?)
    }
}
