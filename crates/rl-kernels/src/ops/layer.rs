//! A whole decoder layer as one differentiable candle op over the input `[T, hidden]` and the
//! layer's weights flattened into one vector ([`LayerWeights::flat`]). On CPU (f32/f64) it runs
//! `cpu::layer`; elsewhere the same math composed of candle ops (`composed::decoder_layer`).
//! Frozen weights may be held in bf16 (half the bytes of a LoRA base from a bf16 checkpoint):
//! the op widens them to the input's dtype for the layer's forward and again for its backward,
//! exactly, so a pass holds one layer's wide copy at a time.

use std::any::Any;
use std::borrow::Cow;
use std::sync::{Arc, Mutex};

use candle_core::{CpuStorage, CustomOp2, CustomOp3, DType, Layout, Shape, Tensor, WithDType};

use super::access::{CpuKernel, cpu_dispatch, on_cpu, op_error, slice, tensor};
use super::adapters::LayerAdapters;
use super::rope::Rope;
use crate::cpu::dropout::Dropout;
use crate::cpu::layer::{Adapters, LayerCtx, LayerShape, Saved, Wanted, layer_backward, layer_forward};
use crate::cpu::lora::LoraShape;
use crate::cpu::norm::RopeTables;
use crate::float::Real;
use crate::layout::RowLayout;

const LAYER: &str = "decoder_layer";

/// One layer's weight tensors (HF layout: projections `[out, in]`), as the model holds them.
#[derive(Debug, Clone, Copy)]
pub struct LayerWeights<'a> {
    /// Input norm.
    pub ln1: &'a Tensor,
    /// Query projection.
    pub q: &'a Tensor,
    /// Key projection.
    pub k: &'a Tensor,
    /// Value projection.
    pub v: &'a Tensor,
    /// q, k, v biases.
    pub qkv_bias: Option<[&'a Tensor; 3]>,
    /// q and k head norms.
    pub qk_norm: Option<[&'a Tensor; 2]>,
    /// Output projection.
    pub o: &'a Tensor,
    /// Its bias.
    pub o_bias: Option<&'a Tensor>,
    /// Post-attention norm.
    pub ln2: &'a Tensor,
    /// Gate projection.
    pub gate: &'a Tensor,
    /// Up projection.
    pub up: &'a Tensor,
    /// Down projection.
    pub down: &'a Tensor,
}

impl LayerWeights<'_> {
    /// All weights in one vector, in [`LayerShape::parts`]' order (differentiable: each weight's
    /// gradient is its slice of the vector's).
    pub fn flat(&self) -> candle_core::Result<Tensor> {
        let mut parts = vec![self.ln1, self.q, self.k, self.v];
        if let Some(b) = &self.qkv_bias {
            parts.extend(b.iter().copied());
        }
        if let Some(n) = &self.qk_norm {
            parts.extend(n.iter().copied());
        }
        parts.push(self.o);
        parts.extend(self.o_bias);
        parts.extend([self.ln2, self.gate, self.up, self.down]);
        let flat = parts.into_iter().map(Tensor::flatten_all).collect::<candle_core::Result<Vec<_>>>()?;
        Tensor::cat(&flat, 0)
    }
}

struct DecoderLayer {
    shape: LayerShape,
    /// The adapters' shape, when the op has a third input (their flat buffer).
    lora: Option<LoraShape>,
    /// Dropout on the adapters' inputs.
    dropout: Option<Dropout>,
    layout: Arc<RowLayout>,
    positions: Arc<[u32]>,
    rope: Rope,
    scale: f64,
    /// The forward's activations (`Saved<T>` for the op's dtype), kept for the backward.
    saved: Mutex<Option<Arc<dyn Any + Send + Sync>>>,
}

impl DecoderLayer {
    fn ctx<'a, T: Real>(&'a self, rope: RopeTables<'a, T>) -> LayerCtx<'a, T> {
        LayerCtx { shape: self.shape, layout: &self.layout, positions: &self.positions, rope, scale: T::of(self.scale) }
    }

    fn adapters<'a, T>(&self, values: Option<&'a [T]>) -> Option<Adapters<'a, T>> {
        Some(Adapters { values: values?, shape: self.lora?, dropout: self.dropout })
    }

    fn check(&self, x: usize, w: usize, ad: Option<usize>, tables: usize) -> candle_core::Result<()> {
        let (t, sh) = (self.positions.len(), self.shape);
        if self.layout.len() != t {
            return Err(op_error(LAYER, "positions and layout disagree on the row's length"));
        }
        if x != t * sh.hidden || w != sh.weight_len() {
            return Err(op_error(LAYER, format!("expected x [{t}, {}] and {} weights", sh.hidden, sh.weight_len())));
        }
        if let (Some(n), Some(lora)) = (ad, self.lora)
            && n != lora.len(&sh)
        {
            return Err(op_error(LAYER, format!("expected {} adapter values, got {n}", lora.len(&sh))));
        }
        let half = sh.attn.head_dim / 2;
        if let Some(p) = self.positions.iter().find(|&&p| (p as usize + 1) * half > tables) {
            return Err(op_error(LAYER, format!("position {p} is beyond the rotary tables")));
        }
        Ok(())
    }

    fn forward<T: Real + WithDType>(
        &self,
        x: &[T],
        w: &[T],
        ad: Option<&[T]>,
        shape: &Shape,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        self.rope.with_cpu_tables::<T, _>(|tables| {
            self.check(x.len(), w.len(), ad.map(<[T]>::len), tables.cos.len())?;
            let (out, saved) = layer_forward(x, w, self.adapters(ad).as_ref(), &self.ctx(tables));
            *self.saved.lock().map_err(|_| op_error(LAYER, "lock poisoned"))? = Some(Arc::new(saved));
            Ok((T::to_cpu_storage_owned(out), shape.clone()))
        })
    }

    /// Gradients of x, of w (unless it is frozen: no weight-gradient product runs) and of the
    /// adapters `a` when given.
    fn backward(&self, x: &Tensor, w: &Tensor, a: Option<&Tensor>, dy: &Tensor) -> candle_core::Result<Grads> {
        struct K<'a> {
            op: &'a DecoderLayer,
            saved: Arc<dyn Any + Send + Sync>,
            x: &'a Tensor,
            w: &'a Tensor,
            a: Option<&'a Tensor>,
        }
        impl CpuKernel for K<'_> {
            type Out = Grads;
            fn run<T: Real + WithDType>(self, xs: &[&[T]]) -> candle_core::Result<Self::Out> {
                let saved = self
                    .saved
                    .downcast_ref::<Saved<T>>()
                    .ok_or_else(|| op_error(LAYER, "dtype changed since the forward"))?;
                let ctx = self.op.ctx(RopeTables { cos: xs[3], sin: xs[4] });
                let ad = self.op.adapters(xs.get(5).copied());
                let want = Wanted { weights: self.w.track_op() };
                let (dx, dw, da) = layer_backward(xs[0], xs[1], ad.as_ref(), saved, xs[2], &ctx, want);
                let dw = dw.map(|d| tensor(d, self.w.shape())).transpose()?;
                let da = match (da, self.a) {
                    (Some(d), Some(a)) => Some(tensor(d, a.shape())?),
                    _ => None,
                };
                Ok((tensor(dx, self.x.shape())?, dw, da))
            }
        }
        let saved = self
            .saved
            .lock()
            .map_err(|_| op_error(LAYER, "lock poisoned"))?
            .clone()
            .ok_or_else(|| op_error(LAYER, "backward before forward"))?;
        let dy = dy.contiguous()?;
        let (cos, sin) = self.rope.tables();
        let wide;
        let w = if w.dtype() == DType::BF16 && x.dtype() != DType::BF16 {
            if w.track_op() {
                return Err(op_error(LAYER, "bf16 weights must be frozen (trained weights are f32)"));
            }
            wide = widened(w, x.dtype())?;
            &wide
        } else {
            w
        };
        let mut inputs = vec![x, w, &dy, cos, sin];
        inputs.extend(a);
        on_cpu(LAYER, &inputs, K { op: self, saved, x, w, a })
    }
}

/// The input's, the weights' and the adapters' gradients.
type Grads = (Tensor, Option<Tensor>, Option<Tensor>);

/// The layer's flat weights as `T`: borrowed, or widened from bf16 (frozen weights held in bf16;
/// every bf16 value is exactly an f32 one), on every thread of the pool.
fn weights<'a, T: Real + WithDType>(s: &'a CpuStorage, l: &Layout) -> candle_core::Result<Cow<'a, [T]>> {
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 16;
    let CpuStorage::BF16(values) = s else { return Ok(Cow::Borrowed(slice::<T>(LAYER, s, l)?)) };
    let (a, b) = l.contiguous_offsets().ok_or_else(|| op_error(LAYER, "inputs must be contiguous"))?;
    let src = &values[a..b];
    let mut out = vec![T::of(0.0); src.len()];
    // A bf16 value's bits are the high half of the f32 with the same value.
    let wide = |bits: u16| f32::from_bits(u32::from(bits) << 16);
    match T::as_f32_mut(&mut out) {
        Some(out) => out.par_chunks_mut(CHUNK).zip(src.par_chunks(CHUNK)).for_each(|(o, v)| {
            o.iter_mut().zip(v).for_each(|(o, v)| *o = wide(v.to_bits()));
        }),
        None => out.iter_mut().zip(src).for_each(|(o, v)| *o = T::of(f64::from(wide(v.to_bits())))),
    }
    Ok(Cow::Owned(out))
}

/// A frozen bf16 CPU tensor widened to `dtype` (f32 or f64) as [`weights`] widens it; any other
/// tensor converted by candle.
fn widened(w: &Tensor, dtype: DType) -> candle_core::Result<Tensor> {
    if !w.device().is_cpu() || !matches!(dtype, DType::F32 | DType::F64) {
        return w.to_dtype(dtype);
    }
    let (storage, layout) = w.storage_and_layout();
    let candle_core::Storage::Cpu(s) = &*storage else { return Err(op_error(LAYER, "a CPU tensor without CPU data")) };
    if dtype == DType::F32 {
        tensor(weights::<f32>(s, layout)?.into_owned(), w.shape())
    } else {
        tensor(weights::<f64>(s, layout)?.into_owned(), w.shape())
    }
}

impl CustomOp2 for DecoderLayer {
    fn name(&self) -> &'static str {
        LAYER
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        cpu_dispatch!(LAYER, s1, |T| self.forward(slice::<T>(LAYER, s1, l1)?, &weights::<T>(s2, l2)?, None, l1.shape()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let (dx, dw, _) = self.backward(x, w, None, dy)?;
        Ok((Some(dx), dw))
    }
}

impl CustomOp3 for DecoderLayer {
    fn name(&self) -> &'static str {
        LAYER
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        cpu_dispatch!(LAYER, s1, |T| {
            let a = slice::<T>(LAYER, s3, l3)?;
            self.forward(slice::<T>(LAYER, s1, l1)?, &weights::<T>(s2, l2)?, Some(a), l1.shape())
        })
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        a: &Tensor,
        _res: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (dx, dw, da) = self.backward(x, w, Some(a), dy)?;
        Ok((Some(dx), dw, da))
    }
}

/// One decoder layer of `x [T, hidden]` (a packed row laid out as `layout`, tokens at
/// `positions`) with flat weights `w` ([`LayerWeights::flat`]); differentiable in both.
pub fn decoder_layer(
    x: &Tensor,
    w: &Tensor,
    layout: Arc<RowLayout>,
    positions: Arc<[u32]>,
    rope: &Rope,
    shape: LayerShape,
    scale: f64,
) -> candle_core::Result<Tensor> {
    decoder_layer_adapted(x, w, None, layout, positions, rope, shape, scale)
}

/// [`decoder_layer`] with low-rank adapters. Differentiable in `x`, `w` and the adapters; a `w`
/// that is not a variable (frozen base weights) gets no gradient and costs no weight-gradient
/// product.
#[allow(clippy::too_many_arguments)]
pub fn decoder_layer_adapted(
    x: &Tensor,
    w: &Tensor,
    adapters: Option<LayerAdapters<'_>>,
    layout: Arc<RowLayout>,
    positions: Arc<[u32]>,
    rope: &Rope,
    shape: LayerShape,
    scale: f64,
) -> candle_core::Result<Tensor> {
    if !super::runs_fused(x) {
        // The composed layer computes in x's dtype throughout.
        let w = &w.to_dtype(x.dtype())?;
        return decoder_layer_recomputed(x, w, adapters, layout, positions, rope, shape, scale);
    }
    let (lora, dropout) = (adapters.map(|a| a.shape), adapters.and_then(|a| a.dropout));
    let rope = rope.clone();
    let op = DecoderLayer { shape, lora, dropout, layout, positions, rope, scale, saved: Mutex::new(None) };
    match adapters {
        Some(a) => x.contiguous()?.apply_op3(&w.contiguous()?, &a.values.contiguous()?, op),
        None => x.contiguous()?.apply_op2(&w.contiguous()?, op),
    }
}

/// What devices without the fused kernels run for [`decoder_layer_adapted`]: the composed layer
/// ([`super::composed::decoder_layer_adapted`]) as one op that keeps only its inputs for the
/// backward, which recomputes the layer (attention inside it one query block at a time). The
/// gradients equal the composed layer's; a training pass holds one layer's intermediates at a time.
#[allow(clippy::too_many_arguments)]
pub fn decoder_layer_recomputed(
    x: &Tensor,
    w: &Tensor,
    adapters: Option<LayerAdapters<'_>>,
    layout: Arc<RowLayout>,
    positions: Arc<[u32]>,
    rope: &Rope,
    shape: LayerShape,
    scale: f64,
) -> candle_core::Result<Tensor> {
    let (lora, dropout) = (adapters.map(|a| a.shape), adapters.and_then(|a| a.dropout));
    let op = ComposedLayer { lora, dropout, layout, positions, rope: rope.clone(), shape, scale };
    match adapters {
        Some(a) => super::recompute::apply(op, &[x, w, a.values]),
        None => super::recompute::apply(op, &[x, w]),
    }
}

/// The composed layer (devices without the fused kernels) as one op that keeps only its inputs:
/// its backward recomputes the layer, so a training pass holds one layer's intermediates at a time.
struct ComposedLayer {
    lora: Option<LoraShape>,
    dropout: Option<Dropout>,
    layout: Arc<RowLayout>,
    positions: Arc<[u32]>,
    rope: Rope,
    shape: LayerShape,
    scale: f64,
}

impl super::recompute::Recomputed for ComposedLayer {
    fn name(&self) -> &'static str {
        LAYER
    }

    fn eval(&self, xs: &[Tensor]) -> candle_core::Result<Tensor> {
        let (x, w) = match xs {
            [x, w, ..] => (x, w),
            _ => return Err(op_error(LAYER, "takes x and the weights")),
        };
        let adapters = match (xs.get(2), self.lora) {
            (Some(values), Some(shape)) => Some(LayerAdapters { values, shape, dropout: self.dropout }),
            _ => None,
        };
        let (layout, positions) = (&self.layout, &self.positions);
        super::composed::decoder_layer_adapted(x, w, adapters, layout, positions, &self.rope, self.shape, self.scale)
    }
}
