//! The Qwen3 decoder. One definition serves training (`forward_packed`, every op differentiable)
//! and generation (`extend`/`decode_step` with per-sequence KV caches). Weights are read through a
//! `VarBuilder` under the HF tensor names, so the same code runs on trainable `Var`s or plain tensors.

use candle_core::{D, Device, Tensor};
use candle_nn::{Linear, Module, VarBuilder};

use crate::config::Qwen3Config;
use crate::error::{Error, Result};
use crate::layers::{Rope, causal_mask, packed_mask, repeat_kv, rms_norm};

/// Rows at least this long attend per sample; shorter rows use one masked product.
const PER_SAMPLE_ATTENTION_MIN_TOKENS: usize = 512;

#[derive(Debug, Clone)]
struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: Tensor,
    k_norm: Tensor,
}

#[derive(Debug, Clone)]
struct Mlp {
    gate: Linear,
    up: Linear,
    down: Linear,
}

#[derive(Debug, Clone)]
struct Layer {
    attn: Attention,
    mlp: Mlp,
    ln1: Tensor,
    ln2: Tensor,
}

/// Cached keys and values of one sequence, per layer (`[1, kv_heads, len, head_dim]`).
#[derive(Debug, Clone, Default)]
pub struct KvCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
    len: usize,
}

impl KvCache {
    /// Tokens cached so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No tokens cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A Qwen3 causal language model.
#[derive(Debug, Clone)]
pub struct Qwen3 {
    cfg: Qwen3Config,
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Tensor,
    rope: Rope,
    device: Device,
}

fn linear(vb: &VarBuilder<'_>, name: &str, out_dim: usize, in_dim: usize) -> Result<Linear> {
    Ok(Linear::new(vb.get((out_dim, in_dim), &format!("{name}.weight"))?, None))
}

impl Qwen3 {
    /// Builds the model from weights named as in HF (`model.layers.0.self_attn.q_proj.weight`, ...).
    pub fn new(cfg: &Qwen3Config, vb: &VarBuilder<'_>) -> Result<Self> {
        cfg.check().map_err(Error::Input)?;
        let (h, hd) = (cfg.hidden_size, cfg.head_dim);
        let (q_dim, kv_dim) = (cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd);
        let m = vb.pp("model");
        let embed = m.get((cfg.vocab_size, h), "embed_tokens.weight")?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let l = m.pp("layers").pp(i.to_string());
            let a = l.pp("self_attn");
            let p = l.pp("mlp");
            layers.push(Layer {
                attn: Attention {
                    q: linear(&a, "q_proj", q_dim, h)?,
                    k: linear(&a, "k_proj", kv_dim, h)?,
                    v: linear(&a, "v_proj", kv_dim, h)?,
                    o: linear(&a, "o_proj", h, q_dim)?,
                    q_norm: a.get(hd, "q_norm.weight")?,
                    k_norm: a.get(hd, "k_norm.weight")?,
                },
                mlp: Mlp {
                    gate: linear(&p, "gate_proj", cfg.intermediate_size, h)?,
                    up: linear(&p, "up_proj", cfg.intermediate_size, h)?,
                    down: linear(&p, "down_proj", h, cfg.intermediate_size)?,
                },
                ln1: l.get(h, "input_layernorm.weight")?,
                ln2: l.get(h, "post_attention_layernorm.weight")?,
            });
        }
        let norm = m.get(h, "norm.weight")?;
        let lm_head =
            if cfg.tie_word_embeddings { embed.clone() } else { vb.get((cfg.vocab_size, h), "lm_head.weight")? };
        let rope = Rope::new(hd, cfg.rope_theta, cfg.max_position_embeddings, embed.dtype(), vb.device())?;
        Ok(Qwen3 { cfg: cfg.clone(), embed, layers, norm, lm_head, rope, device: vb.device().clone() })
    }

    /// The config.
    pub fn config(&self) -> &Qwen3Config {
        &self.cfg
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Projects `[B, T, H]` onto `n` heads: `[B, n, T, head_dim]`.
    fn heads(&self, x: &Tensor, n: usize) -> Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        Ok(x.reshape((b, t, n, self.cfg.head_dim))?.transpose(1, 2)?)
    }

    /// q, k, v `[B, heads, T, head_dim]` for hidden states `x`, rotated at `positions`.
    fn qkv(&self, a: &Attention, x: &Tensor, positions: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let eps = self.cfg.rms_norm_eps;
        let q = rms_norm(&self.heads(&a.q.forward(x)?, self.cfg.num_attention_heads)?, &a.q_norm, eps)?;
        let k = rms_norm(&self.heads(&a.k.forward(x)?, self.cfg.num_key_value_heads)?, &a.k_norm, eps)?;
        let v = self.heads(&a.v.forward(x)?, self.cfg.num_key_value_heads)?;
        let q = self.rope.apply(&q.contiguous()?, positions)?;
        let k = self.rope.apply(&k.contiguous()?, positions)?;
        Ok((q, k, v.contiguous()?))
    }

    /// Scaled dot-product attention with an additive mask; returns `[B, T, heads * head_dim]`.
    fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let n_rep = self.cfg.num_attention_heads / self.cfg.num_key_value_heads;
        let (k, v) = (repeat_kv(k, n_rep)?, repeat_kv(v, n_rep)?);
        let scale = 1.0 / (self.cfg.head_dim as f64).sqrt();
        let scores = (q.matmul(&k.t()?)? * scale)?.broadcast_add(mask)?;
        let probs = candle_nn::ops::softmax(&scores, D::Minus1)?;
        let out = probs.matmul(&v)?;
        let (b, heads, t, d) = out.dims4()?;
        Ok(out.transpose(1, 2)?.reshape((b, t, heads * d))?)
    }

    fn mlp(&self, m: &Mlp, x: &Tensor) -> Result<Tensor> {
        let g = m.gate.forward(x)?.silu()?;
        Ok(m.down.forward(&(g * m.up.forward(x)?)?)?)
    }

    fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        let h = rms_norm(hidden, &self.norm, self.cfg.rms_norm_eps)?;
        Ok(h.broadcast_matmul(&self.lm_head.t()?)?)
    }

    fn check_ids(&self, ids: &[u32]) -> Result<()> {
        if let Some(bad) = ids.iter().find(|&&i| i as usize >= self.cfg.vocab_size) {
            return Err(Error::Input(format!("token id {bad} is outside the vocabulary of {}", self.cfg.vocab_size)));
        }
        Ok(())
    }

    /// Logits `[B, T, vocab]` for packed rows: `input_ids` and `positions` are `B` rows of `T`;
    /// positions restart at each sample, and attention never crosses samples. Differentiable.
    pub fn forward_packed(&self, input_ids: &[Vec<u32>], positions: &[Vec<u32>]) -> Result<Tensor> {
        let t = input_ids.first().map_or(0, Vec::len);
        if positions.len() != input_ids.len() || input_ids.iter().chain(positions).any(|r| r.len() != t) {
            return Err(Error::Input(String::from("input_ids and positions must be rows of equal length")));
        }
        let rows =
            input_ids.iter().zip(positions).map(|(ids, pos)| self.forward_row(ids, pos)).collect::<Result<Vec<_>>>()?;
        Ok(Tensor::stack(&rows, 0)?)
    }

    /// Logits `[T, vocab]` of one packed row. Projections and MLPs run over the whole row. Attention
    /// is one masked `T x T` product for short rows, where kernel overhead dominates, and runs per
    /// sample (a causal mask over each sample's own tokens) for long rows, where the wasted
    /// cross-sample blocks dominate (measured: 7x faster at 2048 tokens in 4 samples). Both compute
    /// the same function.
    fn forward_row(&self, ids: &[u32], positions: &[u32]) -> Result<Tensor> {
        self.check_ids(ids)?;
        if let Some(p) = positions.iter().find(|&&p| p as usize >= self.cfg.max_position_embeddings) {
            return Err(Error::Input(format!("position {p} exceeds max_position_embeddings")));
        }
        let t = ids.len();
        // Sample boundaries: a sample starts wherever the position does not continue the previous one.
        let mut bounds = vec![0usize];
        for i in 1..t {
            if positions[i] != positions[i - 1] + 1 {
                bounds.push(i);
            }
        }
        bounds.push(t);
        let per_sample = t >= PER_SAMPLE_ATTENTION_MIN_TOKENS && bounds.len() > 2;
        let mut masks = std::collections::HashMap::new();
        if per_sample {
            for w in bounds.windows(2) {
                let len = w[1] - w[0];
                if let std::collections::hash_map::Entry::Vacant(e) = masks.entry(len) {
                    e.insert(packed_mask(&[(0..len as u32).collect()], self.embed.dtype(), &self.device)?);
                }
            }
        } else {
            masks.insert(t, packed_mask(&[positions.to_vec()], self.embed.dtype(), &self.device)?);
        }
        let pos = Tensor::from_vec(positions.to_vec(), (1, t), &self.device)?;
        let mut x = self.embed.index_select(&Tensor::new(ids, &self.device)?, 0)?.unsqueeze(0)?;
        for layer in &self.layers {
            let h = rms_norm(&x, &layer.ln1, self.cfg.rms_norm_eps)?;
            let (q, k, v) = self.qkv(&layer.attn, &h, &pos)?;
            let attn = if per_sample {
                let mut outs = Vec::with_capacity(bounds.len() - 1);
                for w in bounds.windows(2) {
                    let (start, len) = (w[0], w[1] - w[0]);
                    let (qs, ks, vs) = (q.narrow(2, start, len)?, k.narrow(2, start, len)?, v.narrow(2, start, len)?);
                    outs.push(self.attend(&qs, &ks, &vs, &masks[&len])?);
                }
                Tensor::cat(&outs, 1)?
            } else {
                self.attend(&q, &k, &v, &masks[&t])?
            };
            x = (x + layer.attn.o.forward(&attn)?)?;
            let h = rms_norm(&x, &layer.ln2, self.cfg.rms_norm_eps)?;
            x = (&x + self.mlp(&layer.mlp, &h)?)?;
        }
        Ok(self.logits(&x)?.squeeze(0)?)
    }

    /// Appends `ids` to one sequence's cache; returns logits `[len(ids), vocab]` (prefill, or
    /// scoring a continuation).
    pub fn extend(&self, ids: &[u32], cache: &mut KvCache) -> Result<Tensor> {
        if ids.is_empty() {
            return Err(Error::Input(String::from("nothing to extend with")));
        }
        self.check_ids(ids)?;
        let past = cache.len;
        let t = ids.len();
        if past + t > self.cfg.max_position_embeddings {
            return Err(Error::Input(format!(
                "sequence of {} tokens exceeds max_position_embeddings ({})",
                past + t,
                self.cfg.max_position_embeddings
            )));
        }
        if cache.layers.is_empty() {
            cache.layers = vec![None; self.layers.len()];
        }
        let pos = Tensor::arange(past as u32, (past + t) as u32, &self.device)?.reshape((1, t))?;
        let mask = causal_mask(t, past, self.embed.dtype(), &self.device)?;
        let mut x = self.embed.index_select(&Tensor::new(ids, &self.device)?, 0)?.unsqueeze(0)?;
        for (layer, slot) in self.layers.iter().zip(cache.layers.iter_mut()) {
            let h = rms_norm(&x, &layer.ln1, self.cfg.rms_norm_eps)?;
            let (q, k, v) = self.qkv(&layer.attn, &h, &pos)?;
            let (k, v) = match slot.take() {
                Some((pk, pv)) => (Tensor::cat(&[&pk, &k], 2)?, Tensor::cat(&[&pv, &v], 2)?),
                None => (k, v),
            };
            let out = self.attend(&q, &k, &v, &mask)?;
            *slot = Some((k, v));
            x = (x + layer.attn.o.forward(&out)?)?;
            let h = rms_norm(&x, &layer.ln2, self.cfg.rms_norm_eps)?;
            x = (&x + self.mlp(&layer.mlp, &h)?)?;
        }
        cache.len += t;
        Ok(self.logits(&x)?.squeeze(0)?)
    }

    /// One decoding step for several sequences at once: `tokens[i]` is appended to `caches[i]`.
    /// Projections and MLPs run batched; attention runs per sequence over its own cache.
    /// Returns logits `[B, vocab]`.
    pub fn decode_step(&self, tokens: &[u32], caches: &mut [&mut KvCache]) -> Result<Tensor> {
        let b = tokens.len();
        if b == 0 || caches.len() != b {
            return Err(Error::Input(String::from("one cache per token is required")));
        }
        self.check_ids(tokens)?;
        if let Some(c) = caches.iter().find(|c| c.is_empty() || c.len >= self.cfg.max_position_embeddings) {
            return Err(Error::Input(format!(
                "cannot decode at position {} (prefill first; max {})",
                c.len, self.cfg.max_position_embeddings
            )));
        }
        let positions: Vec<u32> = caches.iter().map(|c| c.len as u32).collect();
        let pos = Tensor::from_vec(positions, (b, 1), &self.device)?;
        let no_mask = Tensor::zeros((1, 1, 1, 1), self.embed.dtype(), &self.device)?;
        let mut x =
            self.embed.index_select(&Tensor::new(tokens, &self.device)?, 0)?.reshape((b, 1, self.cfg.hidden_size))?;
        for (li, layer) in self.layers.iter().enumerate() {
            let h = rms_norm(&x, &layer.ln1, self.cfg.rms_norm_eps)?;
            let (q, k, v) = self.qkv(&layer.attn, &h, &pos)?;
            let mut outs = Vec::with_capacity(b);
            for (i, cache) in caches.iter_mut().enumerate() {
                let (pk, pv) =
                    cache.layers[li].take().ok_or_else(|| Error::Input(String::from("cache missing a layer")))?;
                let k = Tensor::cat(&[&pk, &k.narrow(0, i, 1)?], 2)?;
                let v = Tensor::cat(&[&pv, &v.narrow(0, i, 1)?], 2)?;
                outs.push(self.attend(&q.narrow(0, i, 1)?, &k, &v, &no_mask)?);
                cache.layers[li] = Some((k, v));
            }
            let out = Tensor::cat(&outs, 0)?;
            x = (x + layer.attn.o.forward(&out)?)?;
            let h = rms_norm(&x, &layer.ln2, self.cfg.rms_norm_eps)?;
            x = (&x + self.mlp(&layer.mlp, &h)?)?;
        }
        for c in caches.iter_mut() {
            c.len += 1;
        }
        Ok(self.logits(&x)?.squeeze(1)?)
    }
}
