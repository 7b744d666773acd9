//! The decoder (Qwen3, Qwen2, Llama: see [`crate::Family`]) as a differentiable candle graph, for training (and scoring): one packed row
//! at a time, laid out by a [`RowLayout`] (independent samples, or completions sharing a prompt).
//! Every non-matmul step is a fused op of `rl-kernels` with a real backward pass. Weights are read
//! through a `VarBuilder` under the HF tensor names, so the same code runs on trainable `Var`s or
//! plain tensors. Generation runs on [`crate::runtime`], which computes the same function.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use rl_kernels::ops::{
    LayerAdapters, LayerWeights, Rope, decoder_layer_adapted, head_norm_rope, rms_norm, rope, swiglu,
};
use rl_kernels::{Dropout, LayerShape, RowLayout};

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::layout::{EMBED, FINAL_NORM, LM_HEAD, LayerWeight};

/// One decoder layer's weights (HF layout: projections are `[out, in]`).
#[derive(Debug, Clone)]
pub(crate) struct Layer {
    pub(crate) q: Tensor,
    pub(crate) k: Tensor,
    pub(crate) v: Tensor,
    pub(crate) o: Tensor,
    /// Biases of q, k, v (Qwen2, or `attention_bias`).
    pub(crate) qkv_bias: Option<[Tensor; 3]>,
    pub(crate) o_bias: Option<Tensor>,
    /// The q and k head norms (Qwen3).
    pub(crate) qk_norm: Option<[Tensor; 2]>,
    pub(crate) gate: Tensor,
    pub(crate) up: Tensor,
    pub(crate) down: Tensor,
    pub(crate) ln1: Tensor,
    pub(crate) ln2: Tensor,
    /// All of the above as the fused layer op's flat vector, when the weights are one trainable
    /// variable per layer ([`crate::Trainable`]); otherwise built from them at each forward.
    pub(crate) flat: Option<Tensor>,
    /// The layer's low-rank adapters as one flat buffer ([`rl_kernels::LoraShape::parts`]),
    /// when the model trains adapters over frozen weights.
    pub(crate) lora: Option<Tensor>,
}

/// `x W^T + b`, with `W` and `b` through `at` (the cast to the compute dtype).
fn linear_bias(x: &Tensor, w: &Tensor, b: Option<&Tensor>, at: &impl Fn(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
    let y = linear(x, &at(w)?)?;
    Ok(match b {
        Some(b) => y.broadcast_add(&at(b)?)?,
        None => y,
    })
}

impl Layer {
    /// The same layer with every tensor mapped through `f`.
    pub(crate) fn map(&self, f: impl Fn(&Tensor) -> Result<Tensor>) -> Result<Layer> {
        let qkv_bias = match &self.qkv_bias {
            Some([q, k, v]) => Some([f(q)?, f(k)?, f(v)?]),
            None => None,
        };
        let qk_norm = match &self.qk_norm {
            Some([q, k]) => Some([f(q)?, f(k)?]),
            None => None,
        };
        Ok(Layer {
            q: f(&self.q)?,
            k: f(&self.k)?,
            v: f(&self.v)?,
            o: f(&self.o)?,
            qkv_bias,
            o_bias: self.o_bias.as_ref().map(&f).transpose()?,
            qk_norm,
            gate: f(&self.gate)?,
            up: f(&self.up)?,
            down: f(&self.down)?,
            ln1: f(&self.ln1)?,
            ln2: f(&self.ln2)?,
            flat: self.flat.as_ref().map(&f).transpose()?,
            lora: self.lora.as_ref().map(&f).transpose()?,
        })
    }

    /// Queries and keys (normed per head in Qwen3, then rotated at `positions`) and values of the
    /// normed input `h [T, hidden]`; weights through `at`.
    pub(crate) fn qkv(
        &self,
        h: &Tensor,
        at: &impl Fn(&Tensor) -> Result<Tensor>,
        eps: f64,
        head_dim: usize,
        positions: &Arc<[u32]>,
        table: &Rope,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let bias = |i: usize| self.qkv_bias.as_ref().map(|b| &b[i]);
        let q = linear_bias(h, &self.q, bias(0), at)?;
        let k = linear_bias(h, &self.k, bias(1), at)?;
        let v = linear_bias(h, &self.v, bias(2), at)?;
        let (q, k) = match &self.qk_norm {
            Some([qn, kn]) => (
                head_norm_rope(&q, &at(qn)?, eps, positions.clone(), table)?,
                head_norm_rope(&k, &at(kn)?, eps, positions.clone(), table)?,
            ),
            None => (rope(&q, head_dim, positions.clone(), table)?, rope(&k, head_dim, positions.clone(), table)?),
        };
        Ok((q, k, v))
    }

    /// The attention output projection.
    pub(crate) fn out_proj(&self, a: &Tensor, at: &impl Fn(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
        linear_bias(a, &self.o, self.o_bias.as_ref(), at)
    }

    /// The weights as the fused decoder-layer op takes them.
    pub(crate) fn weights(&self) -> LayerWeights<'_> {
        LayerWeights {
            ln1: &self.ln1,
            q: &self.q,
            k: &self.k,
            v: &self.v,
            qkv_bias: self.qkv_bias.as_ref().map(|[q, k, v]| [q, k, v]),
            qk_norm: self.qk_norm.as_ref().map(|[q, k]| [q, k]),
            o: &self.o,
            o_bias: self.o_bias.as_ref(),
            ln2: &self.ln2,
            gate: &self.gate,
            up: &self.up,
            down: &self.down,
        }
    }

    /// The SwiGLU MLP of the normed input `h`.
    pub(crate) fn mlp(&self, h: &Tensor, at: &impl Fn(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
        let gated = swiglu(&linear(h, &at(&self.gate)?)?, &linear(h, &at(&self.up)?)?)?;
        linear(&gated, &at(&self.down)?)
    }
}

/// A causal language model of one of the supported families.
#[derive(Debug, Clone)]
pub struct CausalLm {
    cfg: ModelConfig,
    pub(crate) embed: Tensor,
    pub(crate) layers: Vec<Layer>,
    pub(crate) norm: Tensor,
    pub(crate) lm_head: Tensor,
    pub(crate) rope: Rope,
    device: Device,
    /// The dtype the forward pass computes in; weights are cast to it at use, so gradients reach
    /// the stored (master) weights in their own dtype.
    compute: DType,
    /// The adapters' shape when the layers carry low-rank adapters.
    pub(crate) lora: Option<rl_kernels::LoraShape>,
    /// Dropout probability on the adapters' inputs in a training pass ([`Pass::Train`]).
    pub(crate) lora_dropout: f64,
}

/// What a forward pass is for: the adapters' dropout draws masks only in a training pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// Scoring or validation: no dropout.
    Eval,
    /// A training pass whose dropout masks are drawn from `seed` (one per micro-batch of a
    /// step, so the same step draws the same masks when it runs again after a resume).
    Train {
        /// Seeds every layer's masks.
        seed: u64,
    },
}

/// `x W^T` for `x [T, in]` and an HF weight `W [out, in]`.
fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    Ok(rl_kernels::ops::linear(x, w)?)
}

impl CausalLm {
    /// Builds the model from weights named as in HF (`model.layers.0.self_attn.q_proj.weight`, ...).
    pub fn new(cfg: &ModelConfig, vb: &VarBuilder<'_>) -> Result<Self> {
        cfg.check().map_err(Error::Input)?;
        let h = cfg.hidden_size;
        let embed = vb.get((cfg.vocab_size, h), EMBED)?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let get = |w: LayerWeight| vb.get(w.shape(cfg), &w.name(i));
            let maybe = |w: LayerWeight| w.present(cfg).then(|| get(w)).transpose();
            use LayerWeight as W;
            let qkv_bias = match (maybe(W::QBias)?, maybe(W::KBias)?, maybe(W::VBias)?) {
                (Some(q), Some(k), Some(v)) => Some([q, k, v]),
                _ => None,
            };
            let qk_norm = match (maybe(W::QNorm)?, maybe(W::KNorm)?) {
                (Some(q), Some(k)) => Some([q, k]),
                _ => None,
            };
            layers.push(Layer {
                qkv_bias,
                o_bias: maybe(W::OBias)?,
                qk_norm,
                q: get(W::Q)?,
                k: get(W::K)?,
                v: get(W::V)?,
                o: get(W::O)?,
                gate: get(W::Gate)?,
                up: get(W::Up)?,
                down: get(W::Down)?,
                ln1: get(W::InputNorm)?,
                ln2: get(W::PostNorm)?,
                flat: None,
                lora: None,
            });
        }
        let norm = vb.get(h, FINAL_NORM)?;
        let lm_head = if cfg.tie_word_embeddings { embed.clone() } else { vb.get((cfg.vocab_size, h), LM_HEAD)? };
        let rope = Rope::from_inv_freq(&cfg.inv_freq(), cfg.max_position_embeddings, embed.dtype(), vb.device())?;
        let compute = embed.dtype();
        Ok(CausalLm {
            cfg: cfg.clone(),
            embed,
            layers,
            norm,
            lm_head,
            rope,
            device: vb.device().clone(),
            compute,
            lora: None,
            lora_dropout: 0.0,
        })
    }

    /// This model computing in `dtype` (e.g. bf16 over f32 master weights on a GPU).
    pub fn with_compute_dtype(mut self, dtype: DType) -> Self {
        self.compute = dtype;
        self
    }

    /// Whether the layers carry low-rank adapters (trained unmerged; a runtime needs them merged).
    pub fn has_adapters(&self) -> bool {
        self.lora.is_some()
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
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The decoder layers' sizes and parts.
    fn layer_shape(&self) -> LayerShape {
        crate::layout::layer_shape(&self.cfg)
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
        self.hidden_in(ids, layout, Pass::Eval)
    }

    /// [`CausalLm::hidden`] in a training or an eval pass (they differ only under adapter dropout).
    pub fn hidden_in(&self, ids: &[u32], layout: &Arc<RowLayout>, pass: Pass) -> Result<Tensor> {
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
        let shape = self.layer_shape();
        let dropout = match pass {
            Pass::Train { seed } if self.lora_dropout > 0.0 => Some(Dropout { p: self.lora_dropout, seed }),
            _ => None,
        };
        for (i, l) in self.layers.iter().enumerate() {
            let w = match &l.flat {
                // Frozen weights held in bf16 go as they are: the layer op widens them itself,
                // one layer at a time, instead of the pass holding an f32 copy of every layer.
                Some(flat) if flat.dtype() == DType::BF16 && !flat.track_op() => flat.clone(),
                Some(flat) => self.at(flat)?,
                None => l.map(|w| self.at(w))?.weights().flat()?,
            };
            let values = match (&l.lora, self.lora) {
                (Some(a), Some(s)) => Some((self.at(a)?, s)),
                _ => None,
            };
            let adapters = values.as_ref().map(|(values, shape)| LayerAdapters {
                values,
                shape: *shape,
                dropout: dropout.map(|d| d.for_layer(i)),
            });
            x = decoder_layer_adapted(&x, &w, adapters, layout.clone(), positions.clone(), &self.rope, shape, scale)?;
        }
        Ok(rms_norm(&x, &self.at(&self.norm)?, eps)?)
    }

    /// Logits `[R, vocab]` of final-normed hidden rows `[R, hidden]`.
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        linear(hidden, &self.head_weight()?)
    }

    /// The output head `[vocab, hidden]` in the compute dtype (differentiable; the embedding where
    /// they are tied).
    pub fn head_weight(&self) -> Result<Tensor> {
        self.at(&self.lm_head)
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
