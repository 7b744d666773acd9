//! The fused ops' math composed of candle's differentiable ops, for tensors the CPU kernels do not
//! take: any non-CPU device (CUDA runs these through candle's kernels and cuBLAS) and half
//! precision. Reductions (norms, softmax, logsumexp) run in f32 at least, whatever the input dtype. Every
//! function here equals its fused counterpart, forward and backward (tested against it on CPU).

use std::sync::Arc;

use candle_core::{D, DType, Device, Tensor};

use crate::cpu::attention::AttnShape;
use crate::cpu::logprobs::Targets;
use crate::layout::RowLayout;
use crate::ops::rope::Rope;
use crate::ops::softmax_rows;

/// Scores held at once by [`attention`] on the CPU (heads x query block x keys): 2^26 values.
const MAX_SCORES: usize = 1 << 26;
/// The same on a GPU, where fewer, larger blocks launch fewer kernels: 2^28 values (512 MiB in
/// bf16; the backward holds four such matrices).
const MAX_SCORES_DEVICE: usize = 1 << 28;

/// `x` in at least f32 (f64 stays f64).
fn f32_of(x: &Tensor) -> candle_core::Result<Tensor> {
    if x.dtype() == DType::F64 { Ok(x.clone()) } else { x.to_dtype(DType::F32) }
}

/// RMSNorm over the last dimension, times `w`.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> candle_core::Result<Tensor> {
    let xf = f32_of(x)?;
    let var = xf.sqr()?.mean_keepdim(D::Minus1)?;
    let normed = xf.broadcast_div(&(var + eps)?.sqrt()?)?.to_dtype(x.dtype())?;
    normed.broadcast_mul(w)
}

/// Per-head RMSNorm then rotate-half RoPE of `x [T, H*d]` at `positions`.
pub fn head_norm_rope(x: &Tensor, w: &Tensor, eps: f64, positions: &[u32], rope: &Rope) -> candle_core::Result<Tensor> {
    let (t, width) = x.dims2()?;
    let d = w.dim(0)?;
    let heads = width / d;
    let normed = rms_norm(&x.reshape((t, heads, d))?, w, eps)?;
    rotate_half(&normed, positions, rope)?.reshape((t, width))
}

/// Rotate-half RoPE alone of `x [T, H*d]` at `positions`.
pub fn rope(x: &Tensor, d: usize, positions: &[u32], rope: &Rope) -> candle_core::Result<Tensor> {
    let (t, width) = x.dims2()?;
    rotate_half(&x.reshape((t, width / d, d))?, positions, rope)?.reshape((t, width))
}

/// Rotates `x [T, H, d]` at `positions` (HF's rotate-half convention).
fn rotate_half(x: &Tensor, positions: &[u32], rope: &Rope) -> candle_core::Result<Tensor> {
    let (t, _, d) = x.dims3()?;
    let (cos, sin) = rope.tables();
    // Gathered where the tables live, then moved and cast: `T` rows per call, not the whole
    // table (`max_positions` rows, 40k for Qwen3) per layer and per pass.
    let idx = Tensor::new(positions, cos.device())?;
    let gather = |table: &Tensor| -> candle_core::Result<Tensor> {
        table.index_select(&idx, 0)?.to_device(x.device())?.to_dtype(x.dtype())?.reshape((t, 1, d / 2))
    };
    let (cos, sin) = (gather(cos)?, gather(sin)?);
    let (x1, x2) = (x.narrow(2, 0, d / 2)?, x.narrow(2, d / 2, d / 2)?);
    let r1 = (x1.broadcast_mul(&cos)? - x2.broadcast_mul(&sin)?)?;
    let r2 = (x2.broadcast_mul(&cos)? + x1.broadcast_mul(&sin)?)?;
    Tensor::cat(&[r1, r2], 2)
}

/// `silu(gate) * up`.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> candle_core::Result<Tensor> {
    gate.silu()? * up
}

/// `log_softmax` over the last dimension in f32.
fn log_softmax_f32(x: &Tensor) -> candle_core::Result<Tensor> {
    let x = f32_of(x)?;
    let max = x.max_keepdim(D::Minus1)?.detach();
    let shifted = x.broadcast_sub(&max)?;
    shifted.broadcast_sub(&shifted.exp()?.sum_keepdim(D::Minus1)?.log()?)
}

/// Additive mask `[rows, keys]`: 0 where query `q0 + i` sees key `j` (its ancestors' tokens, and
/// its own segment's up to itself; as [`RowLayout::sees`]), -inf elsewhere.
fn mask(layout: &RowLayout, q0: usize, rows: usize, keys: usize, device: &Device) -> candle_core::Result<Tensor> {
    if !device.is_cpu() {
        return mask_on_device(layout, q0, rows, keys, device);
    }
    let seg_of = layout.segment_of();
    let segments = layout.segments();
    let mut data = vec![f32::NEG_INFINITY; rows * keys];
    let mut ancestors: Option<(usize, Vec<std::ops::Range<usize>>)> = None;
    for i in 0..rows {
        let qi = q0 + i;
        let si = seg_of[qi];
        if ancestors.as_ref().is_none_or(|(s, _)| *s != si) {
            ancestors = Some((si, layout.ancestor_ranges(si)));
        }
        let row = &mut data[i * keys..(i + 1) * keys];
        for r in ancestors.iter().flat_map(|(_, a)| a) {
            row[r.start.min(keys)..r.end.min(keys)].fill(0.0);
        }
        row[segments[si].start..=qi].fill(0.0);
    }
    Tensor::from_vec(data, (rows, keys), device)
}

/// [`mask`] built on `device` from the tokens' segments, so a GPU receives a few kilobytes rather
/// than `rows x keys` floats per block: token i sees token j where j's segment is i's or one of
/// its ancestors (whose tokens all come before i's segment) and j <= i.
fn mask_on_device(
    layout: &RowLayout,
    q0: usize,
    rows: usize,
    keys: usize,
    device: &Device,
) -> candle_core::Result<Tensor> {
    let segs = layout.segments();
    let n = segs.len();
    let mut sees = vec![f32::NEG_INFINITY; n * n];
    for s in 0..n {
        let mut cur = Some(s);
        while let Some(a) = cur {
            sees[s * n + a] = 0.0;
            cur = segs[a].parent;
        }
    }
    let seg_of = layout.segment_of();
    let ids = |r: std::ops::Range<usize>| Tensor::from_iter(seg_of[r].iter().map(|&s| s as u32), device);
    let by_segment = Tensor::from_vec(sees, (n, n), device)?
        .index_select(&ids(q0..q0 + rows)?, 0)?
        .index_select(&ids(0..keys)?, 1)?;
    let query = Tensor::arange(q0 as u32, (q0 + rows) as u32, device)?.reshape((rows, 1))?;
    let key = Tensor::arange(0u32, keys as u32, device)?.reshape((1, keys))?;
    let causal = key.broadcast_le(&query)?;
    causal.where_cond(&by_segment, &Tensor::full(f32::NEG_INFINITY, (rows, keys), device)?)
}

/// Attention of `q [T, Hq*d]` over `k`, `v [T, Hk*d]` for a row laid out as `layout`, in query
/// blocks so the scores never exceed [`MAX_SCORES`]; a block attends to keys up to its last query
/// (a token only sees tokens before it in the row).
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    layout: &RowLayout,
    s: AttnShape,
    scale: f64,
) -> candle_core::Result<Tensor> {
    let max_scores = if q.device().is_cpu() { MAX_SCORES } else { MAX_SCORES_DEVICE };
    attention_in_blocks(q, k, v, layout, s, scale, max_scores)
}

/// [`attention`] holding at most `max_scores` scores at once (at least one query row's). When a
/// gradient is wanted, the scores are not kept for the backward: it recomputes them a query block
/// at a time ([`BlockedAttention`]).
pub fn attention_in_blocks(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    layout: &RowLayout,
    s: AttnShape,
    scale: f64,
    max_scores: usize,
) -> candle_core::Result<Tensor> {
    let op = BlockedAttention { layout: Arc::new(layout.clone()), s, scale, max_scores };
    super::recompute::apply(op, &[q, k, v])
}

/// Attention computed (and differentiated) one query block at a time.
struct BlockedAttention {
    layout: Arc<RowLayout>,
    s: AttnShape,
    scale: f64,
    max_scores: usize,
}

impl BlockedAttention {
    /// Query rows per block.
    fn block(&self) -> usize {
        let t = self.layout.len();
        (self.max_scores / (self.s.q_heads * t).max(1)).clamp(1, t.max(1))
    }

    /// `[Hk, T, d]`: keys or values heads first.
    fn heads(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        x.reshape((self.layout.len(), self.s.kv_heads, self.s.head_dim))?.transpose(0, 1)?.contiguous()
    }

    /// `[Hk, rep * rows, d]`: a block's rows `[rows, Hq*d]` (queries, or the output's gradient)
    /// under their key/value head (query head `g * rep + r` reads key/value head `g`).
    fn grouped(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let (d, hk) = (self.s.head_dim, self.s.kv_heads);
        let (rows, rep) = (x.dim(0)?, self.s.q_heads / hk);
        x.reshape((rows, hk, rep, d))?.permute((1, 2, 0, 3))?.contiguous()?.reshape((hk, rep * rows, d))
    }

    /// The inverse of [`Self::grouped`]: `[rows, Hq*d]`.
    fn ungrouped(&self, x: &Tensor, rows: usize) -> candle_core::Result<Tensor> {
        let (d, hk) = (self.s.head_dim, self.s.kv_heads);
        x.reshape((hk, self.s.q_heads / hk, rows, d))?.permute((2, 0, 1, 3))?.reshape((rows, self.s.q_heads * d))
    }

    /// Attention probabilities `[Hk, rep * rows, keys]` of the grouped query rows `qh` of the
    /// block at `q0` over the keys `kb [Hk, keys, d]` (up to its last query), in `qh`'s dtype.
    fn probs(&self, qh: &Tensor, kb: &Tensor, q0: usize, rows: usize) -> candle_core::Result<Tensor> {
        let keys = kb.dim(1)?;
        let scores = qh.matmul(&kb.t()?)?;
        let mask = mask(&self.layout, q0, rows, keys, qh.device())?.to_dtype(scores.dtype())?;
        softmax_rows::masked_softmax(&scores, &mask, self.scale)
    }

    /// Calls `f(q0, rows)` for each query block in order.
    fn for_blocks(&self, mut f: impl FnMut(usize, usize) -> candle_core::Result<()>) -> candle_core::Result<()> {
        let (t, block) = (self.layout.len(), self.block());
        let mut q0 = 0;
        while q0 < t {
            let rows = block.min(t - q0);
            f(q0, rows)?;
            q0 += rows;
        }
        Ok(())
    }
}

impl super::recompute::Recomputed for BlockedAttention {
    fn name(&self) -> &'static str {
        "attention"
    }

    fn eval(&self, xs: &[Tensor]) -> candle_core::Result<Tensor> {
        let [q, k, v] = xs else { return Err(super::access::op_error("attention", "takes q, k, v")) };
        let (kh, vh) = (self.heads(k)?, self.heads(v)?);
        let mut outs = Vec::new();
        self.for_blocks(|q0, rows| {
            let keys = q0 + rows;
            let p = self.probs(&self.grouped(&q.narrow(0, q0, rows)?)?, &kh.narrow(1, 0, keys)?, q0, rows)?;
            outs.push(self.ungrouped(&p.matmul(&vh.narrow(1, 0, keys)?)?, rows)?);
            Ok(())
        })?;
        Tensor::cat(&outs, 0)
    }

    /// The backward written out per block (flash attention's, over materialised blocks): with `P`
    /// recomputed, `dV += P^T dO`, `dS = softmax'(P, dO V^T)`, `dQ = dS K`, `dK += dS^T Q`; every
    /// product a batched matmul over the key/value heads.
    fn grads(&self, xs: &[&Tensor], dy: &Tensor) -> candle_core::Result<Vec<Option<Tensor>>> {
        use super::recompute::accumulate;
        let [q, k, v] = xs else { return Err(super::access::op_error("attention", "takes q, k, v")) };
        let t = self.layout.len();
        let (want_q, want_k, want_v) = (q.track_op(), k.track_op(), v.track_op());
        let (kh, vh) = (self.heads(&k.detach())?, self.heads(&v.detach())?);
        let (q, dy) = (q.detach(), dy.detach());
        let (mut dq, mut dkh, mut dvh) = (Vec::new(), None, None);
        // A block's key/value gradient `[Hk, keys, d]` over every key.
        let padded = |g: Tensor, keys: usize| g.pad_with_zeros(1, 0, t - keys);
        self.for_blocks(|q0, rows| {
            let keys = q0 + rows;
            let (kb, vb) = (kh.narrow(1, 0, keys)?, vh.narrow(1, 0, keys)?);
            let qh = self.grouped(&q.narrow(0, q0, rows)?)?;
            let p = self.probs(&qh, &kb, q0, rows)?;
            let dout = self.grouped(&dy.narrow(0, q0, rows)?.to_dtype(p.dtype())?)?;
            if want_v {
                accumulate(&mut dvh, Some(padded(p.t()?.matmul(&dout)?, keys)?))?;
            }
            if want_q || want_k {
                let ds = softmax_rows::softmax_grad(&p, &dout.matmul(&vb.t()?)?, self.scale)?;
                if want_q {
                    dq.push(self.ungrouped(&ds.matmul(&kb)?, rows)?);
                }
                if want_k {
                    accumulate(&mut dkh, Some(padded(ds.t()?.matmul(&qh)?, keys)?))?;
                }
            }
            Ok(())
        })?;
        let (d, hk) = (self.s.head_dim, self.s.kv_heads);
        let back = |h: Option<Tensor>| h.map(|h| h.transpose(0, 1)?.reshape((t, hk * d))).transpose();
        let dq = if want_q { Some(Tensor::cat(&dq, 0)?) } else { None };
        Ok(vec![dq, back(dkh)?, back(dvh)?])
    }
}

/// `[N, 2]` (f32 at least): each target's log-probability under `softmax(logits[row] / temp)` and that
/// distribution's entropy (detached).
pub fn token_logprobs(logits: &Tensor, targets: &Targets) -> candle_core::Result<Tensor> {
    let device = logits.device();
    let n = targets.len();
    let rows = Tensor::new(targets.rows.as_slice(), device)?;
    let z = f32_of(&logits.index_select(&rows, 0)?)?;
    let temps = Tensor::from_vec(targets.temps.clone(), (n, 1), device)?.to_dtype(z.dtype())?;
    let z = z.broadcast_div(&temps)?;
    let logp = log_softmax_f32(&z)?;
    let ids = Tensor::from_vec(targets.ids.clone(), (n, 1), device)?;
    let lp = logp.gather(&ids, 1)?;
    let entropy = (logp.exp()? * &logp)?.sum_keepdim(1)?.neg()?.detach();
    Tensor::cat(&[lp, entropy], 1)
}

/// The AdamW update written back in place through `slice_set` (the moments `state` are `[2, n]`).
pub fn adamw_step(weight: &Tensor, state: &Tensor, grad: &Tensor, h: &crate::AdamW) -> candle_core::Result<()> {
    let n = weight.elem_count();
    let g = (grad.flatten_all()? * h.grad_scale)?;
    let (m, v) = (state.get(0)?, state.get(1)?);
    let m = ((m * h.beta1)? + (&g * (1.0 - h.beta1))?)?;
    let v = ((v * h.beta2)? + (g.sqr()? * (1.0 - h.beta2))?)?;
    let step = h.step.max(1) as i32;
    let (c1, c2) = (1.0 - h.beta1.powi(step), 1.0 - h.beta2.powi(step));
    let w = weight.flatten_all()?;
    let update = ((&m / c1)? / ((&v / c2)?.sqrt()? + h.eps)?)?;
    let w = ((w * (1.0 - h.lr * h.weight_decay))? - (update * h.lr)?)?;
    state.slice_set(&Tensor::stack(&[m, v], 0)?.reshape(state.shape())?, 0, 0)?;
    weight.slice_set(&w.reshape(weight.shape())?, 0, 0)?;
    debug_assert_eq!(state.elem_count(), 2 * n);
    Ok(())
}

/// One decoder layer of `x [T, hidden]` with flat weights `w` (see [`crate::cpu::layer::LayerShape::parts`]):
/// pre-norm attention with the stacked q/k/v projection, then the pre-norm SwiGLU MLP, both
/// residual.
pub fn decoder_layer(
    x: &Tensor,
    w: &Tensor,
    layout: &RowLayout,
    positions: &[u32],
    rope_tables: &Rope,
    sh: crate::cpu::layer::LayerShape,
    scale: f64,
) -> candle_core::Result<Tensor> {
    decoder_layer_adapted(x, w, None, layout, positions, rope_tables, sh, scale)
}

/// [`decoder_layer`] with low-rank adapters on some projections (`y += s (drop(x) A^T) B^T`; the
/// adapters' flat layout is [`crate::cpu::lora::LoraShape::parts`], the dropout mask
/// [`crate::cpu::dropout::Dropout`]'s, as the fused layer draws it).
#[allow(clippy::too_many_arguments)]
pub fn decoder_layer_adapted(
    x: &Tensor,
    w: &Tensor,
    adapters: Option<super::adapters::LayerAdapters<'_>>,
    layout: &RowLayout,
    positions: &[u32],
    rope_tables: &Rope,
    sh: crate::cpu::layer::LayerShape,
    scale: f64,
) -> candle_core::Result<Tensor> {
    use crate::cpu::lora::Proj;
    let p = sh.parts();
    let part = |r: &std::ops::Range<usize>, dims: &[usize]| w.narrow(0, r.start, r.len())?.reshape(dims);
    let (h, width, inter, d) = (sh.hidden, sh.qkv_width(), sh.intermediate, sh.attn.head_dim);
    let (qd, kd) = (sh.attn.ldq(), sh.attn.ldk());
    let linear = |x: &Tensor, r: &std::ops::Range<usize>, out: usize, inp: usize| -> candle_core::Result<Tensor> {
        x.matmul(&part(r, &[out, inp])?.t()?)
    };
    let lora_parts = adapters.map(|a| a.shape.parts(&sh)).unwrap_or_default();
    // `y + s (drop(x) A^T) B^T` when `proj` is adapted, else `y`.
    let adapt = |y: Tensor, x: &Tensor, proj: Proj| -> candle_core::Result<Tensor> {
        let (Some(ad), Some(lp)) = (adapters, lora_parts.iter().find(|lp| lp.proj == proj)) else {
            return Ok(y);
        };
        let r = ad.shape.rank;
        let am = ad.values.narrow(0, lp.a.start, lp.a.len())?.reshape((r, lp.inp))?;
        let bm = ad.values.narrow(0, lp.b.start, lp.b.len())?.reshape((lp.out, r))?;
        let x = match ad.dropout.filter(crate::cpu::dropout::Dropout::is_active) {
            None => x.clone(),
            Some(d) => {
                let mask = Tensor::from_vec(d.multipliers(proj, x.elem_count()), x.shape(), x.device())?;
                x.broadcast_mul(&mask.to_dtype(x.dtype())?)?
            }
        };
        y + (x.matmul(&am.t()?)?.matmul(&bm.t()?)? * ad.shape.scale)?
    };
    let h1 = rms_norm(x, &part(&p.ln1, &[h])?, sh.eps)?;
    let mut qkv = linear(&h1, &p.qkv, width, h)?;
    if sh.qkv_bias {
        qkv = qkv.broadcast_add(&part(&p.qkv_bias, &[width])?)?;
    }
    let (q, k, v) = (qkv.narrow(1, 0, qd)?, qkv.narrow(1, qd, kd)?, qkv.narrow(1, qd + kd, kd)?);
    let (q, k, v) = (adapt(q, &h1, Proj::Q)?, adapt(k, &h1, Proj::K)?, adapt(v, &h1, Proj::V)?.contiguous()?);
    let (q, k) = if sh.qk_norm {
        (
            head_norm_rope(&q.contiguous()?, &part(&p.q_norm, &[d])?, sh.eps, positions, rope_tables)?,
            head_norm_rope(&k.contiguous()?, &part(&p.k_norm, &[d])?, sh.eps, positions, rope_tables)?,
        )
    } else {
        (rope(&q.contiguous()?, d, positions, rope_tables)?, rope(&k.contiguous()?, d, positions, rope_tables)?)
    };
    let a = attention(&q, &k, &v, layout, sh.attn, scale)?;
    let mut attn_out = linear(&a, &p.o, h, qd)?;
    if sh.o_bias {
        attn_out = attn_out.broadcast_add(&part(&p.o_bias, &[h])?)?;
    }
    let attn_out = adapt(attn_out, &a, Proj::O)?;
    let x2 = (x + attn_out)?;
    let h2 = rms_norm(&x2, &part(&p.ln2, &[h])?, sh.eps)?;
    let gu = linear(&h2, &p.gate_up, 2 * inter, h)?;
    let gate = adapt(gu.narrow(1, 0, inter)?, &h2, Proj::Gate)?;
    let up = adapt(gu.narrow(1, inter, inter)?, &h2, Proj::Up)?;
    let act = swiglu(&gate.contiguous()?, &up.contiguous()?)?;
    x2 + adapt(linear(&act, &p.down, h, inter)?, &act, Proj::Down)?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_device_mask_equals_the_host_mask() {
        let layout = RowLayout::new(&[5, 4, 3, 6, 2], &[None, Some(0), Some(0), None, Some(3)]).unwrap();
        let t = layout.len();
        for (q0, rows) in [(0, t), (0, 3), (4, 7), (9, 11), (17, 3)] {
            let keys = q0 + rows;
            let host = mask(&layout, q0, rows, keys, &Device::Cpu).unwrap();
            let dev = mask_on_device(&layout, q0, rows, keys, &Device::Cpu).unwrap();
            assert_eq!(host.to_vec2::<f32>().unwrap(), dev.to_vec2::<f32>().unwrap(), "block at {q0} of {rows} rows");
        }
    }
}
