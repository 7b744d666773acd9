//! The device runtime: generation with candle ops on the model's device (CUDA in a `cuda` build;
//! it runs on CPU too, which is how it is tested against [`super::CpuRuntime`]). Weights are cast
//! once to the model's compute dtype; each sequence's keys and values live on the device in
//! buffers that grow by doubling, written in place (`slice_set`). Projections and MLPs run over
//! every new token of the step at once; attention runs per sequence over its cache.

use std::sync::Arc;

use candle_core::{D, DType, Device, Tensor};
use rl_kernels::ops::{Rope, linear, rms_norm};

use super::{Rows, Runtime};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::model::{CausalLm, Layer};

/// Keys and values of consecutive tokens, per layer, on the device (`[capacity, kv width]` each;
/// the first `len` rows are filled).
#[derive(Debug, Clone)]
struct DeviceKv {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    len: usize,
}

impl DeviceKv {
    fn empty(layers: usize) -> Self {
        DeviceKv { k: Vec::with_capacity(layers), v: Vec::with_capacity(layers), len: 0 }
    }

    /// Rows `0..len` of layer `l`.
    fn rows(&self, l: usize, len: usize) -> Result<(Tensor, Tensor)> {
        Ok((self.k[l].narrow(0, 0, len)?, self.v[l].narrow(0, 0, len)?))
    }
}

/// A prefix several sequences continue (a prompt prefilled once).
#[derive(Debug, Clone)]
pub struct TensorPrefix(Arc<DeviceKv>);

/// One sequence's cache: an optional shared prefix and its own keys and values.
#[derive(Debug)]
pub struct TensorCache {
    prefix: Option<Arc<DeviceKv>>,
    own: DeviceKv,
    capacity: usize,
    /// Own rows written in the current forward call, per layer (committed after the last layer).
    pending: usize,
}

impl TensorCache {
    fn len(&self) -> usize {
        self.prefix.as_ref().map_or(0, |p| p.len) + self.own.len
    }
}

/// A model ready to generate with candle ops on its device.
#[derive(Debug, Clone)]
pub struct TensorRuntime {
    cfg: ModelConfig,
    embed: Tensor,
    lm_head: Tensor,
    norm: Tensor,
    layers: Vec<Layer>,
    rope: Rope,
    dtype: DType,
    device: Device,
}

impl TensorRuntime {
    /// `model`'s weights cast once to its compute dtype, on its device.
    pub fn new(model: &CausalLm) -> Result<Self> {
        super::no_adapters(model)?;
        let dtype = model.compute_dtype();
        let c = |t: &Tensor| -> Result<Tensor> { Ok(t.detach().to_dtype(dtype)?) };
        let layers = model.layers.iter().map(|l| l.map(c)).collect::<Result<Vec<_>>>()?;
        Ok(TensorRuntime {
            cfg: model.config().clone(),
            embed: c(&model.embed)?,
            lm_head: c(&model.lm_head)?,
            norm: c(&model.norm)?,
            layers,
            rope: model.rope.clone(),
            dtype,
            device: model.device().clone(),
        })
    }

    fn kv_width(&self) -> usize {
        self.cfg.num_key_value_heads * self.cfg.head_dim
    }

    /// Writes `k`/`v` rows of layer `l` after the cache's own rows, growing its buffers as needed.
    fn append(&self, cache: &mut TensorCache, l: usize, k: &Tensor, v: &Tensor) -> Result<()> {
        let n = k.dim(0)?;
        let at = cache.own.len;
        if cache.own.k.is_empty() || at + n > cache.capacity {
            // Every layer at once (the first layer of a step decides): the committed rows move over.
            let cap =
                if cache.own.k.is_empty() { cache.capacity.max(at + n) } else { (2 * cache.capacity).max(at + n) };
            let layers = self.cfg.num_hidden_layers;
            let grow = |old: Option<&Tensor>| -> Result<Tensor> {
                let fresh = Tensor::zeros((cap, self.kv_width()), self.dtype, &self.device)?;
                if let Some(old) = old.filter(|_| at > 0) {
                    fresh.slice_set(&old.narrow(0, 0, at)?.contiguous()?, 0, 0)?;
                }
                Ok(fresh)
            };
            let k_new = (0..layers).map(|i| grow(cache.own.k.get(i))).collect::<Result<Vec<_>>>()?;
            let v_new = (0..layers).map(|i| grow(cache.own.v.get(i))).collect::<Result<Vec<_>>>()?;
            (cache.own.k, cache.own.v, cache.capacity) = (k_new, v_new, cap);
        }
        cache.own.k[l].slice_set(&k.contiguous()?, 0, at)?;
        cache.own.v[l].slice_set(&v.contiguous()?, 0, at)?;
        cache.pending = n;
        Ok(())
    }

    /// Attention of a sequence's `m` new query rows `q [m, Hq*d]` over its cache at layer `l`
    /// (new keys already written): new token j sees everything before it and itself.
    fn attend(&self, cache: &TensorCache, l: usize, q: &Tensor) -> Result<Tensor> {
        let c = &self.cfg;
        let (d, hq, hk) = (c.head_dim, c.num_attention_heads, c.num_key_value_heads);
        let rep = hq / hk;
        let m = q.dim(0)?;
        let own_len = cache.own.len + m;
        let (mut ks, mut vs) = (Vec::with_capacity(2), Vec::with_capacity(2));
        if let Some(p) = &cache.prefix {
            let (k, v) = p.rows(l, p.len)?;
            ks.push(k);
            vs.push(v);
        }
        let (k, v) = cache.own.rows(l, own_len)?;
        ks.push(k);
        vs.push(v);
        let (k, v) = (Tensor::cat(&ks, 0)?, Tensor::cat(&vs, 0)?);
        let keys = k.dim(0)?;
        let kh = k.reshape((keys, hk, d))?.transpose(0, 1)?.contiguous()?;
        let vh = v.reshape((keys, hk, d))?.transpose(0, 1)?.contiguous()?;
        let qh = q.reshape((m, hk, rep, d))?.permute((1, 2, 0, 3))?.contiguous()?.reshape((hk, rep * m, d))?;
        let scale = 1.0 / (d as f64).sqrt();
        let scores = (qh.matmul(&kh.t()?)? * scale)?.to_dtype(DType::F32)?.reshape((hk, rep, m, keys))?;
        let scores = if m > 1 {
            // New token j (at position keys - m + j) sees keys 0..=keys - m + j.
            let first = keys - m;
            let mask: Vec<f32> =
                (0..m * keys).map(|x| if x % keys <= first + x / keys { 0.0 } else { f32::NEG_INFINITY }).collect();
            scores.broadcast_add(&Tensor::from_vec(mask, (m, keys), &self.device)?)?
        } else {
            scores
        };
        let max = scores.max_keepdim(D::Minus1)?;
        let e = scores.broadcast_sub(&max)?.exp()?;
        let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?.to_dtype(self.dtype)?.reshape((hk, rep * m, keys))?;
        let out = p.matmul(&vh)?.reshape((hk, rep, m, d))?;
        Ok(out.permute((2, 0, 1, 3))?.reshape((m, hq * d))?)
    }

    fn copy_prefix(&self, cache: &TensorCache, len: usize) -> Result<TensorPrefix> {
        let layers = self.cfg.num_hidden_layers;
        let mut kv = DeviceKv::empty(layers);
        let from_prefix = cache.prefix.as_ref().map_or(0, |p| p.len.min(len));
        let from_own = len - from_prefix;
        for l in 0..layers {
            let (mut ks, mut vs) = (Vec::new(), Vec::new());
            if let Some(p) = cache.prefix.as_ref().filter(|_| from_prefix > 0) {
                let (k, v) = p.rows(l, from_prefix)?;
                ks.push(k);
                vs.push(v);
            }
            if from_own > 0 {
                let (k, v) = cache.own.rows(l, from_own)?;
                ks.push(k);
                vs.push(v);
            }
            let empty = || Tensor::zeros((0, self.kv_width()), self.dtype, &self.device);
            kv.k.push(if ks.is_empty() { empty()? } else { Tensor::cat(&ks, 0)?.contiguous()?.copy()? });
            kv.v.push(if vs.is_empty() { empty()? } else { Tensor::cat(&vs, 0)?.contiguous()?.copy()? });
        }
        kv.len = len;
        Ok(TensorPrefix(Arc::new(kv)))
    }

    fn forward_inner(&self, caches: &mut [&mut TensorCache], tokens: &[&[u32]], want: &[Rows]) -> Result<Vec<f32>> {
        let c = &self.cfg;
        let eps = c.rms_norm_eps;
        let ids: Vec<u32> = tokens.iter().flat_map(|t| t.iter().copied()).collect();
        let positions: Arc<[u32]> = caches
            .iter()
            .zip(tokens)
            .flat_map(|(cache, t)| (0..t.len()).map(move |j| (cache.len() + j) as u32))
            .collect::<Vec<_>>()
            .into();
        let mut x = self.embed.index_select(&Tensor::new(ids.as_slice(), &self.device)?, 0)?;
        // The weights are already in the compute dtype.
        let as_is = |w: &Tensor| -> Result<Tensor> { Ok(w.clone()) };
        for (li, l) in self.layers.iter().enumerate() {
            let h = rms_norm(&x, &l.ln1, eps)?;
            let (q, k, v) = l.qkv(&h, &as_is, eps, c.head_dim, &positions, &self.rope)?;
            let mut outs = Vec::with_capacity(tokens.len());
            let mut row = 0;
            for (cache, t) in caches.iter_mut().zip(tokens) {
                let n = t.len();
                self.append(cache, li, &k.narrow(0, row, n)?, &v.narrow(0, row, n)?)?;
                outs.push(self.attend(cache, li, &q.narrow(0, row, n)?)?);
                row += n;
            }
            x = (x + l.out_proj(&Tensor::cat(&outs, 0)?, &as_is)?)?;
            let h = rms_norm(&x, &l.ln2, eps)?;
            x = (&x + l.mlp(&h, &as_is)?)?;
        }
        for cache in caches.iter_mut() {
            cache.own.len += cache.pending;
            cache.pending = 0;
        }
        let mut rows: Vec<u32> = Vec::new();
        let mut start = 0u32;
        for (t, w) in tokens.iter().zip(want) {
            let n = t.len() as u32;
            match w {
                Rows::All => rows.extend(start..start + n),
                Rows::Last => rows.push(start + n - 1),
            }
            start += n;
        }
        let picked = x.index_select(&Tensor::new(rows.as_slice(), &self.device)?, 0)?;
        let logits = linear(&rms_norm(&picked, &self.norm, eps)?, &self.lm_head)?;
        Ok(logits.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?)
    }
}

impl Runtime for TensorRuntime {
    type Cache = TensorCache;
    type Prefix = TensorPrefix;

    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn with_weights(
        &self,
        dir: &std::path::Path,
        tensors: std::collections::HashMap<String, candle_core::Tensor>,
    ) -> Result<Self> {
        let model = crate::model_from_weights(&self.cfg, dir, tensors, &self.device)?.with_compute_dtype(self.dtype);
        TensorRuntime::new(&model)
    }
    fn with_adapter(&self, dir: &std::path::Path, update: &super::AdapterUpdate) -> Result<Self> {
        let base = update.base.as_ref().ok_or_else(|| {
            Error::Input(String::from("the tensor runtime merges adapters into base weights, and the update has none"))
        })?;
        let merged = crate::merge_adapters(&self.cfg, &update.lora, base, &update.adapters)?;
        self.with_weights(dir, merged)
    }

    fn new_cache(&self, prefix: Option<&TensorPrefix>, capacity: usize) -> TensorCache {
        TensorCache {
            prefix: prefix.map(|p| p.0.clone()),
            own: DeviceKv::empty(self.cfg.num_hidden_layers),
            capacity: capacity.max(1),
            pending: 0,
        }
    }

    fn cache_len(cache: &TensorCache) -> usize {
        cache.len()
    }

    fn share_first(&self, cache: &TensorCache, len: usize) -> Result<TensorPrefix> {
        self.copy_prefix(cache, len.min(cache.len()))
    }

    fn freeze(&self, cache: TensorCache) -> Result<TensorPrefix> {
        let len = cache.len();
        self.copy_prefix(&cache, len)
    }

    fn prefix_len(prefix: &TensorPrefix) -> usize {
        prefix.0.len
    }

    fn prefix_bytes(prefix: &TensorPrefix) -> usize {
        prefix.0.k.iter().chain(&prefix.0.v).map(|t| t.elem_count() * t.dtype().size_in_bytes()).sum()
    }

    fn forward_rows(&self, caches: &mut [&mut TensorCache], tokens: &[&[u32]], rows: &[Rows]) -> Result<Vec<f32>> {
        if caches.len() != tokens.len() || rows.len() != tokens.len() {
            return Err(Error::Input(String::from("one token list and one row choice per cache are required")));
        }
        for (c, t) in caches.iter().zip(tokens) {
            self.check(c.len(), t)?;
        }
        self.forward_inner(caches, tokens, rows)
    }
}
