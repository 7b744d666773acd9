//! The sizes of a decoder layer and where each of its weights sits in the flat buffer the fused
//! layer and its LoRA adapters read.

use std::ops::Range;

use crate::cpu::attention::AttnShape;
use crate::cpu::norm::HeadSpan;

/// Sizes and optional parts of a decoder layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerShape {
    /// Width of the residual stream.
    pub hidden: usize,
    /// Attention heads.
    pub attn: AttnShape,
    /// Width of the MLP.
    pub intermediate: usize,
    /// RMSNorm epsilon (the layer norms and the q/k norms).
    pub eps: f64,
    /// q/k/v projections have biases (Qwen2, Llama's `attention_bias`).
    pub qkv_bias: bool,
    /// Queries and keys are RMS-normalised per head before the rotation (Qwen3).
    pub qk_norm: bool,
    /// The output projection has a bias (Llama's `attention_bias`).
    pub o_bias: bool,
}

/// Where each weight sits in the flat buffer (empty ranges for absent parts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerParts {
    /// Input norm `[hidden]`.
    pub ln1: Range<usize>,
    /// q, k, v projections stacked: `[(Hq + 2 Hk) d, hidden]`.
    pub qkv: Range<usize>,
    /// Their biases `[(Hq + 2 Hk) d]`.
    pub qkv_bias: Range<usize>,
    /// q head norm `[d]`.
    pub q_norm: Range<usize>,
    /// k head norm `[d]`.
    pub k_norm: Range<usize>,
    /// Output projection `[hidden, Hq d]`.
    pub o: Range<usize>,
    /// Its bias `[hidden]`.
    pub o_bias: Range<usize>,
    /// Post-attention norm `[hidden]`.
    pub ln2: Range<usize>,
    /// Gate and up projections stacked: `[2 intermediate, hidden]`.
    pub gate_up: Range<usize>,
    /// Down projection `[hidden, intermediate]`.
    pub down: Range<usize>,
}

impl LayerShape {
    /// Width of the packed q/k/v rows.
    pub fn qkv_width(&self) -> usize {
        self.attn.ldq() + 2 * self.attn.ldk()
    }

    /// The flat weight layout, in this order: ln1, q/k/v, q/k/v biases, q norm, k norm, o, o bias,
    /// ln2, gate/up, down.
    pub fn parts(&self) -> LayerParts {
        let (h, w, d, i) = (self.hidden, self.qkv_width(), self.attn.head_dim, self.intermediate);
        let mut at = 0;
        let mut next = |len: usize| {
            let r = at..at + len;
            at += len;
            r
        };
        LayerParts {
            ln1: next(h),
            qkv: next(w * h),
            qkv_bias: next(if self.qkv_bias { w } else { 0 }),
            q_norm: next(if self.qk_norm { d } else { 0 }),
            k_norm: next(if self.qk_norm { d } else { 0 }),
            o: next(h * self.attn.ldq()),
            o_bias: next(if self.o_bias { h } else { 0 }),
            ln2: next(h),
            gate_up: next(2 * i * h),
            down: next(h * i),
        }
    }

    /// Values in the flat weight buffer.
    pub fn weight_len(&self) -> usize {
        self.parts().down.end
    }

    /// The head spans of a packed q/k/v row (values copied).
    pub(crate) fn spans<'a, T>(&self, w: &'a [T], p: &LayerParts) -> [HeadSpan<'a, T>; 2] {
        let norm = |r: &Range<usize>| if self.qk_norm { Some(&w[r.clone()]) } else { None };
        [
            HeadSpan { heads: self.attn.q_heads, norm: norm(&p.q_norm) },
            HeadSpan { heads: self.attn.kv_heads, norm: norm(&p.k_norm) },
        ]
    }
}
