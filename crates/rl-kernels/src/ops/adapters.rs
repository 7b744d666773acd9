//! What a layer pass takes of its low-rank adapters (shared by the fused and the composed layer).

use candle_core::Tensor;

use crate::cpu::dropout::Dropout;
use crate::cpu::lora::LoraShape;

/// A layer pass's low-rank adapters: the layer's flat adapter buffer, its shape
/// ([`LoraShape::parts`]) and, in a training pass, the dropout on the adapters' inputs.
#[derive(Debug, Clone, Copy)]
pub struct LayerAdapters<'a> {
    /// `A` and `B` of every adapted projection.
    pub values: &'a Tensor,
    /// Rank, scale and targets.
    pub shape: LoraShape,
    /// Dropout (PEFT's `lora_dropout`) for this layer and pass; `None` evaluates.
    pub dropout: Option<Dropout>,
}
