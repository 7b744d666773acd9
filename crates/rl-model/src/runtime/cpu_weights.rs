//! The CPU runtime's weights: each layer's projections packed for [`PackedLinear::apply`] (in f32,
//! or in bf16 where the model computes in bf16), the rest as f32 buffers.

use rl_kernels::cpu::packed::{PackedLinear, bf16_bits, bf16_value};

use crate::error::Result;
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
