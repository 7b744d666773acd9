//! The fused ops' math composed of candle's differentiable ops, for tensors the CPU kernels do not
//! take: any non-CPU device (CUDA runs these through candle's kernels and cuBLAS) and half
//! precision. Reductions (norms, softmax, logsumexp) run in f32 at least, whatever the input dtype. Every
//! function here equals its fused counterpart, forward and backward (tested against it on CPU).

use candle_core::{D, DType, Device, Tensor};

use crate::cpu::attention::AttnShape;
use crate::cpu::logprobs::Targets;
use crate::layout::RowLayout;
use crate::ops::rope::Rope;

/// Scores held at once by [`attention`] (heads x query block x keys): 2^26 f32 values, 256 MiB.
const MAX_SCORES: usize = 1 << 26;

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
    let idx = Tensor::new(positions, x.device())?;
    let (cos, sin) = rope.tables();
    let gather = |table: &Tensor| -> candle_core::Result<Tensor> {
        table.to_device(x.device())?.to_dtype(x.dtype())?.index_select(&idx, 0)?.reshape((t, 1, d / 2))
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

/// Softmax over the last dimension in f32 (the max is a constant: it cancels in the gradient).
fn softmax_f32(x: &Tensor) -> candle_core::Result<Tensor> {
    let x = f32_of(x)?;
    let max = x.max_keepdim(D::Minus1)?.detach();
    let e = x.broadcast_sub(&max)?.exp()?;
    e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
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
    attention_in_blocks(q, k, v, layout, s, scale, MAX_SCORES)
}

/// [`attention`] holding at most `max_scores` scores at once (at least one query row's).
pub fn attention_in_blocks(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    layout: &RowLayout,
    s: AttnShape,
    scale: f64,
    max_scores: usize,
) -> candle_core::Result<Tensor> {
    let t = layout.len();
    let (d, hk) = (s.head_dim, s.kv_heads);
    let rep = s.q_heads / hk;
    // Heads first: [Hk, T, d] for keys and values, [Hk, rep, T, d] for queries (q head g*rep + r).
    let kh = k.reshape((t, hk, d))?.transpose(0, 1)?.contiguous()?;
    let vh = v.reshape((t, hk, d))?.transpose(0, 1)?.contiguous()?;
    let qh = q.reshape((t, hk, rep, d))?.permute((1, 2, 0, 3))?.contiguous()?;
    let block = (max_scores / (s.q_heads * t).max(1)).clamp(1, t);
    let mut outs = Vec::new();
    let mut q0 = 0;
    while q0 < t {
        let rows = block.min(t - q0);
        let keys = q0 + rows;
        let qb = qh.narrow(2, q0, rows)?.reshape((hk, rep * rows, d))?;
        let kb = kh.narrow(1, 0, keys)?;
        let vb = vh.narrow(1, 0, keys)?;
        let scores = (qb.matmul(&kb.t()?)? * scale)?.reshape((hk, rep, rows, keys))?;
        let scores = f32_of(&scores)?;
        let scores = scores.broadcast_add(&mask(layout, q0, rows, keys, q.device())?.to_dtype(scores.dtype())?)?;
        let p = softmax_f32(&scores)?.to_dtype(q.dtype())?.reshape((hk, rep * rows, keys))?;
        outs.push(p.matmul(&vb)?.reshape((hk, rep, rows, d))?);
        q0 += rows;
    }
    let out = Tensor::cat(&outs, 2)?; // [Hk, rep, T, d]
    out.permute((2, 0, 1, 3))?.reshape((t, s.q_heads * d))
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
