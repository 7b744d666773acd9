//! The CPU runtime's weights: each layer's projections packed for [`PackedLinear::apply`] (in f32,
//! or in bf16 where the model computes in bf16), the rest as f32 buffers; LoRA adapters packed
//! apart from the base weights they add to.

use std::collections::HashMap;

use candle_core::Tensor;
use rl_kernels::cpu::packed::{PackedLinear, bf16_bits, bf16_value};
use rl_kernels::{LoraShape, Proj};

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::layout::layer_shape;
use crate::lora::{Lora, adapter_shapes};
use crate::model::CausalLm;

/// One layer's weights: projections packed for [`PackedLinear::apply`] (q/k/v stacked into one
/// product, gate/up into another: fewer, larger products), the rest as f32 buffers.
#[derive(Debug, Clone)]
pub(super) struct Layer {
    /// `[q; k; v]`: each token's row of the product is its queries, keys, then values.
    pub(super) qkv: PackedLinear,
    pub(super) o: PackedLinear,
    /// The q, k, v biases concatenated (Qwen2, or `attention_bias`).
    pub(super) qkv_bias: Option<Vec<f32>>,
    pub(super) o_bias: Option<Vec<f32>>,
    /// q and k head norms (Qwen3).
    pub(super) qk_norm: Option<[Vec<f32>; 2]>,
    /// `[gate; up]`: each row is the gate's columns, then the up projection's.
    pub(super) gate_up: PackedLinear,
    pub(super) down: PackedLinear,
    pub(super) ln1: Vec<f32>,
    pub(super) ln2: Vec<f32>,
}

/// A `[out, in]` weight tensor packed for the runtime (in bf16 when `bf16`).
fn packed(t: &candle_core::Tensor, bf16: bool) -> Result<PackedLinear> {
    stacked(&[t], bf16)
}

/// `[out_i, in]` weights stacked along their outputs and packed as one (in bf16 when `bf16`).
fn stacked(ts: &[&candle_core::Tensor], bf16: bool) -> Result<PackedLinear> {
    let mut w = Vec::new();
    let (mut out, mut inp) = (0, 0);
    for t in ts {
        let (o, i) = t.dims2()?;
        w.extend(values(t)?);
        (out, inp) = (out + o, i);
    }
    Ok(if bf16 { PackedLinear::new_bf16(&w, out, inp) } else { PackedLinear::new(&w, out, inp) })
}

fn values(t: &candle_core::Tensor) -> Result<Vec<f32>> {
    Ok(t.to_dtype(candle_core::DType::F32)?.flatten_all()?.to_vec1()?)
}

/// A model's weights as the CPU runtime holds them.
pub(super) struct Packed {
    pub(super) layers: Vec<Layer>,
    pub(super) embed: Vec<f32>,
    pub(super) lm_head: PackedLinear,
    pub(super) norm: Vec<f32>,
    pub(super) cos: Vec<f32>,
    pub(super) sin: Vec<f32>,
}

/// Copies `model`'s weights (any device, any float dtype) into f32 buffers, every matrix
/// (projections, embedding, output head) rounded to bf16 and the projections and head packed in
/// bf16 when `bf16`.
pub(super) fn pack(model: &CausalLm, bf16: bool) -> Result<Packed> {
    let layers = model
        .layers
        .iter()
        .map(|l| {
            Ok(Layer {
                qkv: stacked(&[&l.q, &l.k, &l.v], bf16)?,
                o: packed(&l.o, bf16)?,
                qkv_bias: match &l.qkv_bias {
                    Some([q, k, v]) => Some([values(q)?, values(k)?, values(v)?].concat()),
                    None => None,
                },
                o_bias: l.o_bias.as_ref().map(values).transpose()?,
                qk_norm: match &l.qk_norm {
                    Some([q, k]) => Some([values(q)?, values(k)?]),
                    None => None,
                },
                gate_up: stacked(&[&l.gate, &l.up], bf16)?,
                down: packed(&l.down, bf16)?,
                ln1: values(&l.ln1)?,
                ln2: values(&l.ln2)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let (cos, sin) = model.rope.tables();
    let embed = values(&model.embed)?;
    Ok(Packed {
        layers,
        lm_head: packed(&model.lm_head, bf16)?,
        // Rounded like the head it is tied to (or would be): in bf16 every matrix is bf16.
        embed: if bf16 { embed.into_iter().map(|v| bf16_value(bf16_bits(v))).collect() } else { embed },
        norm: values(&model.norm)?,
        cos: values(cos)?,
        sin: values(sin)?,
    })
}

/// One projection's LoRA adapter, unmerged: adds `scale * (x A^T) B^T` to the columns
/// `col..col + out` of the product its projection is part of.
#[derive(Debug, Clone)]
pub(super) struct Adapter {
    /// `A [r, in]`.
    a: PackedLinear,
    /// `B [out, r]`.
    b: PackedLinear,
    col: usize,
    scale: f32,
}

impl Adapter {
    /// Adds the adapter's output for the `n` rows of `x` into the rows of `y`, `ld` values each.
    pub(super) fn add(&self, y: &mut [f32], ld: usize, x: &[f32], n: usize) {
        let (r, out) = (self.a.out(), self.b.out());
        let mut t = vec![0f32; n * r];
        self.a.apply(&mut t, x, n, false);
        let mut u = vec![0f32; n * out];
        self.b.apply(&mut u, &t, n, false);
        for (row, d) in y.chunks_mut(ld).take(n).zip(u.chunks(out)) {
            row[self.col..self.col + out].iter_mut().zip(d).for_each(|(y, d)| *y += self.scale * d);
        }
    }
}

/// One layer's adapters, by the packed product they add to.
#[derive(Debug, Clone, Default)]
pub(super) struct LayerAdapters {
    pub(super) qkv: Vec<Adapter>,
    pub(super) o: Vec<Adapter>,
    pub(super) gate_up: Vec<Adapter>,
    pub(super) down: Vec<Adapter>,
}

impl LayerAdapters {
    /// A layer's adapters from its flat buffer (the fused layer's order, [`LoraShape::parts`]).
    /// They stay in f32 whatever the base weights are packed in (a few MB even at 0.6B).
    fn from_flat(cfg: &ModelConfig, shape: &LoraShape, flat: &[f32]) -> LayerAdapters {
        let sh = layer_shape(cfg);
        let mut out = LayerAdapters::default();
        for part in shape.parts(&sh) {
            let adapter = Adapter {
                a: PackedLinear::new(&flat[part.a.clone()], shape.rank, part.inp),
                b: PackedLinear::new(&flat[part.b.clone()], part.out, shape.rank),
                col: match part.proj {
                    Proj::O | Proj::Down => 0,
                    p => p.column(&sh),
                },
                scale: shape.scale as f32,
            };
            match part.proj {
                Proj::Q | Proj::K | Proj::V => out.qkv.push(adapter),
                Proj::O => out.o.push(adapter),
                Proj::Gate | Proj::Up => out.gate_up.push(adapter),
                Proj::Down => out.down.push(adapter),
            }
        }
        out
    }
}

/// The adapters a model carries unmerged (none: an empty list).
pub(super) fn model_adapters(model: &CausalLm) -> Result<Vec<LayerAdapters>> {
    let Some(shape) = model.lora else { return Ok(Vec::new()) };
    model
        .layers
        .iter()
        .map(|l| match &l.lora {
            Some(flat) => Ok(LayerAdapters::from_flat(model.config(), &shape, &values(flat)?)),
            None => Err(Error::Input(String::from("a layer of the adapted model has no adapters"))),
        })
        .collect()
}

/// Adapters read from an adapter directory (PEFT names, checked by
/// [`crate::read_adapter_dir`]), packed by layer.
pub(super) fn named_adapters(
    cfg: &ModelConfig,
    lora: &Lora,
    tensors: &HashMap<String, Tensor>,
) -> Result<Vec<LayerAdapters>> {
    (0..cfg.num_hidden_layers)
        .map(|i| {
            let mut flat = Vec::new();
            for (name, _) in adapter_shapes(cfg, lora, i) {
                let t = tensors.get(&name).ok_or_else(|| Error::Input(format!("the adapter has no {name}")))?;
                flat.extend(values(t)?);
            }
            Ok(LayerAdapters::from_flat(cfg, &lora.shape, &flat))
        })
        .collect()
}
