//! Inference runtimes: the same function as [`Qwen3::hidden`] + [`Qwen3::logits`] over KV caches,
//! behind one trait ([`Runtime`]) that the generation engine drives. [`CpuRuntime`] runs on plain
//! f32 buffers with the kernels of `rl-kernels` (no graph, no per-op tensors), over KV caches that
//! grow in place; [`TensorRuntime`] runs candle ops on any device (CUDA) with caches as device
//! tensors. One call advances any number of sequences by any number of tokens (a prefill, a
//! batched decode step, or both): projections and MLPs run over all new tokens at once.

mod api;
mod cpu_weights;
mod kv;
mod tensor;

use rl_kernels::cpu::attention::{Causal, KvRun, attend};
use rl_kernels::cpu::decode::{attend_shared, attend_step};
use rl_kernels::cpu::norm::{HeadSpan, RopeTables, heads_norm_rope_forward, rms_norm_forward};
use rl_kernels::cpu::packed::PackedLinear;

use std::sync::Arc;

use cpu_weights::{Adapter, Layer, LayerAdapters};
use rl_kernels::cpu::swiglu::swiglu_packed_forward;
use rl_kernels::gemm::{MatMut, MatRef};

use rayon::prelude::*;

pub use api::{AdapterUpdate, Rows, Runtime};
pub use kv::{KvBlock, SeqCache, SharedPrefix};
pub use tensor::{TensorCache, TensorPrefix, TensorRuntime};

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::model::CausalLm;

impl Runtime for CpuRuntime {
    type Cache = SeqCache;
    type Prefix = SharedPrefix;

    fn config(&self) -> &ModelConfig {
        &self.cfg
    }
    fn with_weights(
        &self,
        dir: &std::path::Path,
        tensors: std::collections::HashMap<String, candle_core::Tensor>,
    ) -> Result<Self> {
        let model = crate::model_from_weights(&self.cfg, dir, tensors, &candle_core::Device::Cpu)?;
        CpuRuntime::with_weight_dtype(&model, self.weight_dtype)
    }
    fn with_adapter(&self, _dir: &std::path::Path, update: &AdapterUpdate) -> Result<Self> {
        self.with_adapters(&update.lora, &update.adapters)
    }
    fn new_cache(&self, prefix: Option<&SharedPrefix>, capacity: usize) -> SeqCache {
        CpuRuntime::new_cache(self, prefix, capacity)
    }
    fn cache_len(cache: &SeqCache) -> usize {
        cache.len()
    }
    fn share_first(&self, cache: &SeqCache, len: usize) -> Result<SharedPrefix> {
        Ok(cache.share_first(len))
    }
    fn freeze(&self, cache: SeqCache) -> Result<SharedPrefix> {
        Ok(cache.into_shared())
    }
    fn prefix_len(prefix: &SharedPrefix) -> usize {
        prefix.len()
    }
    fn prefix_bytes(prefix: &SharedPrefix) -> usize {
        prefix.bytes()
    }
    fn forward_rows(&self, caches: &mut [&mut SeqCache], tokens: &[&[u32]], rows: &[Rows]) -> Result<Vec<f32>> {
        CpuRuntime::forward_rows(self, caches, tokens, rows)
    }
}

/// One unit of a forward call's attention: a sequence alone, or the decode rows of sequences that
/// continue one shared prefix (each with its output rows).
enum Work<'c, 'o> {
    One(usize, &'o mut [f32]),
    Shared(&'c KvBlock, Vec<(usize, &'o mut [f32])>),
}

/// Sequence `i` (output rows `out[i]`) alone, except that decode rows (one new token) continuing
/// the same shared prefix form one unit: the samples of a prompt attend to it together.
fn by_shared_prefix<'c, 'o>(
    caches: &'c [&mut SeqCache],
    tokens: &[&[u32]],
    out: Vec<&'o mut [f32]>,
) -> Vec<Work<'c, 'o>> {
    let mut work = Vec::with_capacity(out.len());
    let mut unit_of: std::collections::HashMap<*const KvBlock, usize> = std::collections::HashMap::new();
    for (i, o) in out.into_iter().enumerate() {
        match &caches[i].prefix {
            Some(p) if tokens[i].len() == 1 && !p.is_empty() => {
                let key = std::sync::Arc::as_ptr(p);
                match unit_of.get(&key).and_then(|&u| work.get_mut(u)) {
                    Some(Work::Shared(_, members)) => members.push((i, o)),
                    _ => {
                        unit_of.insert(key, work.len());
                        work.push(Work::Shared(p, vec![(i, o)]));
                    }
                }
            }
            _ => work.push(Work::One(i, o)),
        }
    }
    work
}

/// A model ready to generate on the CPU.
#[derive(Debug, Clone)]
pub struct CpuRuntime {
    cfg: ModelConfig,
    embed: Arc<[f32]>,
    /// The output head (the embedding itself, packed, when tied).
    lm_head: Arc<PackedLinear>,
    norm: Vec<f32>,
    /// The base weights (shared by the runtimes that differ in adapters only).
    layers: Arc<[Layer]>,
    /// Each layer's LoRA adapters, computed apart from the base weights; empty: none.
    adapters: Arc<[LayerAdapters]>,
    cos: Vec<f32>,
    sin: Vec<f32>,
    /// What the projections and the output head are packed in (F32 or BF16).
    weight_dtype: candle_core::DType,
}

/// Sequences a thread takes at least when a forward call's sequences are split between threads:
/// one AVX-512 register tile of rows. Measured on 2 cores, small preset, decode: 24 sequences
/// split 12 + 12 run 16.2k tok/s against 14.2k split by columns; 16 split 8 + 8 gain nothing;
/// 8 split 4 + 4 lose a quarter.
const SEQS_PER_PART: usize = 12;

/// `out = x W^T (+ b)` for `n` rows.
fn linear_bias(out: &mut [f32], x: &[f32], w: &PackedLinear, b: Option<&[f32]>, n: usize) {
    match b {
        Some(b) => {
            out.chunks_mut(w.out()).take(n).for_each(|row| row.copy_from_slice(b));
            w.apply(out, x, n, true);
        }
        None => w.apply(out, x, n, false),
    }
}

/// Adds each adapter's output for the `n` rows of `x` into the rows of `y` (`ld` values each).
fn add_adapters(adapters: &[Adapter], y: &mut [f32], ld: usize, x: &[f32], n: usize) {
    adapters.iter().for_each(|a| a.add(y, ld, x, n));
}

/// Adds `b` to every row of `x`.
fn add_rows(x: &mut [f32], b: &[f32]) {
    x.chunks_mut(b.len()).for_each(|row| row.iter_mut().zip(b).for_each(|(x, b)| *x += b));
}

/// A runtime that computes the base weights only (the tensor runtime) needs adapters merged into
/// them first ([`crate::merge_adapters`]), or generation would silently ignore them.
pub(crate) fn no_adapters(model: &CausalLm) -> Result<()> {
    if model.has_adapters() {
        return Err(Error::Input(String::from(
            "the model carries unmerged LoRA adapters: merge them before generating",
        )));
    }
    Ok(())
}

impl CpuRuntime {
    /// Copies `model`'s weights (any device, any float dtype) into f32 buffers; every matrix
    /// (projections, embedding, output head) in bf16 when the model computes in bf16 (half the
    /// bytes each decoded token reads; norms, biases, activations, caches and sums stay f32). A
    /// bf16 runtime computes exactly what the f32 one computes on the weights rounded to bf16,
    /// and so an f32 runtime packs a matrix whose values are all bf16 values in bf16 too. The
    /// LoRA adapters of an adapted model are computed unmerged, in f32 (as the trainer does).
    pub fn new(model: &CausalLm) -> Result<Self> {
        let dtype = if model.compute_dtype() == candle_core::DType::BF16 {
            candle_core::DType::BF16
        } else {
            candle_core::DType::F32
        };
        Self::with_weight_dtype(model, dtype)
    }

    /// [`CpuRuntime::new`] with the matrices held in `weight_dtype` (F32 or BF16; anything else is
    /// an error).
    pub fn with_weight_dtype(model: &CausalLm, weight_dtype: candle_core::DType) -> Result<Self> {
        let bf16 = match weight_dtype {
            candle_core::DType::F32 => false,
            candle_core::DType::BF16 => true,
            other => return Err(Error::Input(format!("the CPU runtime packs weights in f32 or bf16, not {other:?}"))),
        };
        let p = cpu_weights::pack(model, bf16)?;
        let cfg = model.config().clone();
        let (layers, embed, lm_head, norm, cos, sin) =
            (p.layers.into(), p.embed.into(), p.lm_head.into(), p.norm, p.cos, p.sin);
        let adapters = cpu_weights::model_adapters(model)?.into();
        Ok(CpuRuntime { cfg, embed, lm_head, norm, layers, adapters, cos, sin, weight_dtype })
    }

    /// The same base weights with `tensors`' adapters (PEFT names, as [`crate::read_adapter_dir`]
    /// reads them) in place of any this runtime computes: nothing of the base is packed again.
    pub fn with_adapters(
        &self,
        lora: &crate::Lora,
        tensors: &std::collections::HashMap<String, candle_core::Tensor>,
    ) -> Result<Self> {
        let adapters = cpu_weights::named_adapters(&self.cfg, lora, tensors)?.into();
        Ok(CpuRuntime { adapters, ..self.clone() })
    }

    /// Whether LoRA adapters are computed over the base weights.
    pub fn has_adapters(&self) -> bool {
        !self.adapters.is_empty()
    }

    /// The architecture.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// What the projections and the output head are packed in.
    pub fn weight_dtype(&self) -> candle_core::DType {
        self.weight_dtype
    }

    /// Bytes of the packed projections and output head: what a decode step reads. Less than 4 a
    /// value in an f32 runtime where matrices hold only bf16 values (a bf16 checkpoint), which
    /// are packed in bf16 with the same results.
    pub fn packed_bytes(&self) -> usize {
        let layers: usize =
            self.layers.iter().map(|l| l.qkv.bytes() + l.o.bytes() + l.gate_up.bytes() + l.down.bytes()).sum();
        layers + self.lm_head.bytes()
    }

    /// An empty cache continuing `prefix` (if any), with room for `capacity` own tokens.
    pub fn new_cache(&self, prefix: Option<&SharedPrefix>, capacity: usize) -> SeqCache {
        let width = self.cfg.num_key_value_heads * self.cfg.head_dim;
        SeqCache { prefix: prefix.map(|p| p.0.clone()), own: KvBlock::new(self.cfg.num_hidden_layers, width, capacity) }
    }

    /// Whether `tokens` can be appended to a sequence of `cached` tokens (see [`Runtime::check`]).
    pub fn check(&self, cached: usize, tokens: &[u32]) -> Result<()> {
        Runtime::check(self, cached, tokens)
    }

    /// Appends `tokens[i]` to `caches[i]` for every i and returns logits, row-major `[rows, vocab]`:
    /// each sequence's last new token, or (`all`) every new token in order.
    pub fn forward(&self, caches: &mut [&mut SeqCache], tokens: &[&[u32]], all: bool) -> Result<Vec<f32>> {
        let rows = vec![if all { Rows::All } else { Rows::Last }; tokens.len()];
        self.forward_rows(caches, tokens, &rows)
    }

    /// [`CpuRuntime::forward`] with a choice per sequence: logits of its last new token or of all
    /// of them (rows in sequence order).
    pub fn forward_rows(&self, caches: &mut [&mut SeqCache], tokens: &[&[u32]], rows: &[Rows]) -> Result<Vec<f32>> {
        if caches.len() != tokens.len() || rows.len() != tokens.len() {
            return Err(Error::Input(String::from("one token list and one row choice per cache are required")));
        }
        for (c, t) in caches.iter().zip(tokens) {
            self.check(c.len(), t)?;
        }
        // On a pool thread, so the kernels' parallel loops over small inputs run inline, with the
        // pool's other threads awake for the many small parallel products of a decode step.
        let parts = rayon::current_num_threads().min(caches.len() / SEQS_PER_PART).max(1);
        rl_kernels::on_awake_pool(|| self.forward_parts(caches, tokens, rows, parts))
    }

    /// [`CpuRuntime::forward_on_pool`] with the sequences split into `parts` runs of consecutive
    /// sequences with about equal token counts, side by side. Rows are independent in every op, so
    /// the logits are bit-identical to one call's; a batched decode step then needs no
    /// synchronisation between threads per op (a dozen per layer when each product is split by
    /// columns instead).
    fn forward_parts(
        &self,
        caches: &mut [&mut SeqCache],
        tokens: &[&[u32]],
        rows: &[Rows],
        parts: usize,
    ) -> Result<Vec<f32>> {
        if parts <= 1 {
            return self.forward_on_pool(caches, tokens, rows);
        }
        let total: usize = tokens.iter().map(|t| t.len()).sum();
        let left = parts / 2;
        let target = total * left / parts;
        let mut cut = 0;
        let mut seen = 0;
        while cut < tokens.len() - 1 && seen + tokens[cut].len() <= target {
            seen += tokens[cut].len();
            cut += 1;
        }
        let cut = cut.max(1);
        let (ca, cb) = caches.split_at_mut(cut);
        let (a, b) = rayon::join(
            || self.forward_parts(ca, &tokens[..cut], &rows[..cut], left),
            || self.forward_parts(cb, &tokens[cut..], &rows[cut..], parts - left),
        );
        let mut logits = a?;
        logits.extend(b?);
        Ok(logits)
    }

    fn forward_on_pool(&self, caches: &mut [&mut SeqCache], tokens: &[&[u32]], want: &[Rows]) -> Result<Vec<f32>> {
        let c = &self.cfg;
        let (h, eps, inter) = (c.hidden_size, c.rms_norm_eps, c.intermediate_size);
        let (qd, kd) = (c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim);
        let n: usize = tokens.iter().map(|t| t.len()).sum();
        let mut positions = Vec::with_capacity(n);
        let mut x = Vec::with_capacity(n * h);
        for (cache, toks) in caches.iter().zip(tokens) {
            positions.extend((0..toks.len()).map(|j| (cache.len() + j) as u32));
            for &id in *toks {
                x.extend_from_slice(&self.embed[id as usize * h..(id as usize + 1) * h]);
            }
        }
        let tables = RopeTables { cos: &self.cos, sin: &self.sin };
        let width = qd + 2 * kd;
        let mut qkv = vec![0f32; n * width];
        let mut gu = vec![0f32; n * 2 * inter];
        let none = LayerAdapters::default();
        for (li, l) in self.layers.iter().enumerate() {
            let ad = self.adapters.get(li).unwrap_or(&none);
            let hn = rms_norm_forward(&x, &l.ln1, eps);
            linear_bias(&mut qkv, &hn, &l.qkv, l.qkv_bias.as_deref(), n);
            add_adapters(&ad.qkv, &mut qkv, width, &hn, n);
            let norm = |i: usize| l.qk_norm.as_ref().map(|w| w[i].as_slice());
            let spans = [
                HeadSpan { heads: c.num_attention_heads, norm: norm(0) },
                HeadSpan { heads: c.num_key_value_heads, norm: norm(1) },
            ];
            let qkv = heads_norm_rope_forward(&qkv, width, c.head_dim, &spans, eps, &positions, tables);
            let mut row = 0;
            for (cache, toks) in caches.iter_mut().zip(tokens) {
                cache.own.append_rows(li, &qkv[row * width..], toks.len(), width, qd, qd + kd);
                row += toks.len();
            }
            let a = self.attention(li, caches, tokens, &qkv, width);
            if let Some(b) = &l.o_bias {
                add_rows(&mut x, b);
            }
            l.o.apply(&mut x, &a, n, true);
            add_adapters(&ad.o, &mut x, h, &a, n);
            let hn = rms_norm_forward(&x, &l.ln2, eps);
            l.gate_up.apply(&mut gu, &hn, n, false);
            add_adapters(&ad.gate_up, &mut gu, 2 * inter, &hn, n);
            let act = swiglu_packed_forward(&gu, inter);
            l.down.apply(&mut x, &act, n, true);
            add_adapters(&ad.down, &mut x, h, &act, n);
        }
        let mut rows = Vec::new();
        let mut start = 0;
        for (t, w) in tokens.iter().zip(want) {
            match w {
                Rows::All => rows.extend(start..start + t.len()),
                Rows::Last => rows.push(start + t.len() - 1),
            }
            start += t.len();
        }
        let picked: Vec<f32> = rows.iter().flat_map(|&r| x[r * h..(r + 1) * h].iter().copied()).collect();
        let hn = rms_norm_forward(&picked, &self.norm, eps);
        let vocab = c.vocab_size;
        let mut logits = vec![0f32; rows.len() * vocab];
        self.lm_head.apply(&mut logits, &hn, rows.len(), false);
        Ok(logits)
    }

    /// Attention of every sequence's new query rows over its cache (new keys already appended),
    /// `[n, q_heads * head_dim]`; the queries are the first columns of rows of `ldq` values.
    fn attention(&self, layer: usize, caches: &[&mut SeqCache], tokens: &[&[u32]], q: &[f32], ldq: usize) -> Vec<f32> {
        let c = &self.cfg;
        let (d, hq, hk) = (c.head_dim, c.num_attention_heads, c.num_key_value_heads);
        let (qd, kd, rep) = (hq * d, hk * d, hq / hk);
        let scale = 1.0 / (d as f32).sqrt();
        let n: usize = tokens.iter().map(|t| t.len()).sum();
        let mut out = vec![0f32; n * qd];
        let starts: Vec<usize> = tokens
            .iter()
            .scan(0, |s, t| {
                let start = *s;
                *s += t.len();
                Some(start)
            })
            .collect();
        let mut chunks = Vec::with_capacity(tokens.len());
        let mut rest = out.as_mut_slice();
        for t in tokens {
            let (head, tail) = rest.split_at_mut(t.len() * qd);
            chunks.push(head);
            rest = tail;
        }
        let work = by_shared_prefix(caches, tokens, chunks);
        // One sequence alone: its attention is split over the pool (below).
        let lone = work.len() == 1 && rayon::current_num_threads() > 1;
        let own_run = |i: usize, g: usize| {
            let own = &caches[i].own;
            KvRun { k: &own.k[layer][g * d..], v: &own.v[layer][g * d..], len: own.rows(layer) }
        };
        work.into_par_iter().for_each_init(
            || (Vec::new(), Vec::new(), Vec::new(), Vec::new()),
            |(s, lse, qg, og), unit| match unit {
                Work::Shared(prefix, mut members) => {
                    let w = rep * d;
                    let m = members.len();
                    for g in 0..hk {
                        qg.clear();
                        for (i, _) in &members {
                            let at = starts[*i] * ldq + g * w;
                            qg.extend_from_slice(&q[at..at + w]);
                        }
                        og.resize(m * w, 0.0);
                        let own: Vec<KvRun<'_, f32>> = members.iter().map(|(i, _)| own_run(*i, g)).collect();
                        let pre =
                            KvRun { k: &prefix.k[layer][g * d..], v: &prefix.v[layer][g * d..], len: prefix.len() };
                        attend_shared(MatRef::new(qg, m * rep, d, d, 1), rep, pre, &own, kd, scale, s, og);
                        for (mi, (_, o)) in members.iter_mut().enumerate() {
                            o[g * w..(g + 1) * w].copy_from_slice(&og[mi * w..(mi + 1) * w]);
                        }
                    }
                }
                Work::One(i, o) => {
                    let (cache, rows, start) = (&caches[i], tokens[i].len(), starts[i]);
                    let runs = |g: usize| {
                        let mut r = Vec::with_capacity(2);
                        if let Some(p) = &cache.prefix {
                            r.push(KvRun { k: &p.k[layer][g * d..], v: &p.v[layer][g * d..], len: p.len() });
                        }
                        r.push(own_run(i, g));
                        r
                    };
                    let diag = cache.own.rows(layer) - rows;
                    if rows == 1 {
                        // One token: all its heads in one sweep over the cache rows; the only
                        // sequence's groups in two halves, one a thread (the pool idles otherwise).
                        let half = if lone && hk >= 2 { hk / 2 } else { hk };
                        let (qs, (oa, ob)) = (&q[start * ldq..], o.split_at_mut(half * rep * d));
                        let (ra, rb) = (runs(0), if half < hk { runs(half) } else { Vec::new() });
                        let (a, b) = rayon::join(
                            || attend_step(qs, half, rep, d, &ra, kd, scale, s, oa),
                            || {
                                half == hk
                                    || attend_step(
                                        &qs[half * rep * d..],
                                        hk - half,
                                        rep,
                                        d,
                                        &rb,
                                        kd,
                                        scale,
                                        &mut Vec::new(),
                                        ob,
                                    )
                            },
                        );
                        if a && b {
                            return;
                        }
                        // Else its heads sharing a key/value head are one [rep x d] block.
                        lse.resize(rep, 0.0);
                        for g in 0..hk {
                            let qb = MatRef::new(&q[start * ldq + g * rep * d..], rep, d, d, 1);
                            let ob = MatMut::new(&mut o[g * rep * d..], rep, d, d, 1);
                            attend(qb, &runs(g), kd, Causal { diag, step: 0 }, scale, s, ob, lse, 1);
                        }
                    } else {
                        lse.resize(rows, 0.0);
                        for head in 0..hq {
                            let qb = MatRef::new(&q[start * ldq + head * d..], rows, d, ldq, 1);
                            let ob = MatMut::new(&mut o[head * d..], rows, d, qd, 1);
                            attend(qb, &runs(head / rep), kd, Causal { diag, step: 1 }, scale, s, ob, lse, 1);
                        }
                    }
                }
            },
        );
        out
    }
}
