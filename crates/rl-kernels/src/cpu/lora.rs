//! Low-rank adapters (LoRA) on a decoder layer's projections: `y += s (x A^T) B^T` with
//! `A [r, in]`, `B [out, r]` and `s = alpha / r`, forward and backward on plain slices. The fused
//! layer (`cpu::layer`) calls these at each adapted projection, writing into the column slice of
//! the stacked q/k/v or gate/up output; the adapters of one layer travel as one flat buffer in the
//! order [`LoraShape::parts`] documents.

use std::ops::Range;

use crate::cpu::layer_shape::LayerShape;
use crate::float::Real;
use crate::gemm::{MatMut, MatRef, matmul_par, product_new};

/// A projection of a decoder layer that can carry an adapter, in the flat buffer's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proj {
    /// `q_proj`.
    Q,
    /// `k_proj`.
    K,
    /// `v_proj`.
    V,
    /// `o_proj`.
    O,
    /// `gate_proj`.
    Gate,
    /// `up_proj`.
    Up,
    /// `down_proj`.
    Down,
}

impl Proj {
    /// Every projection, in the flat buffer's order.
    pub const ALL: [Proj; 7] = [Proj::Q, Proj::K, Proj::V, Proj::O, Proj::Gate, Proj::Up, Proj::Down];

    /// The HF module name (`q_proj`, ...), as PEFT's `target_modules` spell it.
    pub fn module(self) -> &'static str {
        match self {
            Proj::Q => "q_proj",
            Proj::K => "k_proj",
            Proj::V => "v_proj",
            Proj::O => "o_proj",
            Proj::Gate => "gate_proj",
            Proj::Up => "up_proj",
            Proj::Down => "down_proj",
        }
    }

    /// The projection of an HF module name.
    pub fn from_module(name: &str) -> Option<Proj> {
        Proj::ALL.into_iter().find(|p| p.module() == name)
    }

    /// Whether the module sits under `self_attn` (else under `mlp`).
    pub fn in_attention(self) -> bool {
        matches!(self, Proj::Q | Proj::K | Proj::V | Proj::O)
    }

    /// `(in, out)` widths of this projection in a layer of shape `sh`.
    pub fn dims(self, sh: &LayerShape) -> (usize, usize) {
        let (h, qd, kd, i) = (sh.hidden, sh.attn.ldq(), sh.attn.ldk(), sh.intermediate);
        match self {
            Proj::Q => (h, qd),
            Proj::K | Proj::V => (h, kd),
            Proj::O => (qd, h),
            Proj::Gate | Proj::Up => (h, i),
            Proj::Down => (i, h),
        }
    }

    /// First column of this projection's output inside the product the fused layer computes
    /// (the stacked q/k/v, the stacked gate/up, or the residual stream).
    pub fn column(self, sh: &LayerShape) -> usize {
        match self {
            Proj::K => sh.attn.ldq(),
            Proj::V => sh.attn.ldq() + sh.attn.ldk(),
            Proj::Up => sh.intermediate,
            Proj::Q | Proj::O | Proj::Gate | Proj::Down => 0,
        }
    }
}

/// The adapters of a layer: their rank, scale and which projections carry one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoraShape {
    /// The rank `r`.
    pub rank: usize,
    /// `alpha / r` (PEFT's scaling).
    pub scale: f64,
    /// Which projections are adapted, indexed as [`Proj::ALL`].
    pub targets: [bool; 7],
}

/// Where one projection's adapter sits in the flat buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraPart {
    /// The projection.
    pub proj: Proj,
    /// `A [r, in]`.
    pub a: Range<usize>,
    /// `B [out, r]`.
    pub b: Range<usize>,
    /// Its input width.
    pub inp: usize,
    /// Its output width.
    pub out: usize,
}

impl LoraShape {
    /// Whether `p` carries an adapter.
    pub fn targets(&self, p: Proj) -> bool {
        self.targets[p as usize]
    }

    /// The flat layout: for each adapted projection in [`Proj::ALL`] order, `A` then `B`.
    pub fn parts(&self, sh: &LayerShape) -> Vec<LoraPart> {
        let mut at = 0;
        Proj::ALL
            .into_iter()
            .filter(|&p| self.targets(p))
            .map(|proj| {
                let (inp, out) = proj.dims(sh);
                let a = at..at + self.rank * inp;
                let b = a.end..a.end + out * self.rank;
                at = b.end;
                LoraPart { proj, a, b, inp, out }
            })
            .collect()
    }

    /// Values in a layer's flat adapter buffer.
    pub fn len(&self, sh: &LayerShape) -> usize {
        self.parts(sh).last().map_or(0, |p| p.b.end)
    }

    /// Whether no projection is adapted.
    pub fn is_empty(&self) -> bool {
        !self.targets.iter().any(|&t| t) || self.rank == 0
    }
}

/// One adapted projection's input and output as the fused layer holds them: `t` rows of `x`
/// (`[t, inp]`) and the destination's row stride `ld` (its output is columns
/// `col..col + out` of a wider product).
#[derive(Debug, Clone, Copy)]
pub struct Site {
    /// Rows (tokens).
    pub t: usize,
    /// Row stride of the output (and of its gradient).
    pub ld: usize,
    /// First output column.
    pub col: usize,
}

/// `y[:, col..col + out] += s (x A^T) B^T`; returns `u = x A^T` (`[t, r]`, kept for the backward).
pub fn lora_forward<T: Real>(y: &mut [T], x: &[T], ad: &[T], part: &LoraPart, site: Site, r: usize, s: T) -> Vec<T> {
    let (a, b) = (&ad[part.a.clone()], &ad[part.b.clone()]);
    let u = product_new(
        MatRef::rows(x, site.t, part.inp, part.inp),
        MatRef::rows(a, r, part.inp, part.inp).t(),
        T::ONE,
        true,
    );
    let dst = MatMut::rows(&mut y[site.col..], site.t, part.out, site.ld);
    matmul_par(dst, MatRef::rows(&u, site.t, r, r), MatRef::rows(b, part.out, r, r).t(), s, true);
    u
}

/// The backward of [`lora_forward`] given the output's gradient `dy` (the same wide layout as
/// `y`): writes `dA`, `dB` into `d_ad` and adds the input's gradient into `dx`.
#[allow(clippy::too_many_arguments)]
pub fn lora_backward<T: Real>(
    dy: &[T],
    x: &[T],
    u: &[T],
    ad: &[T],
    d_ad: &mut [T],
    dx: &mut [T],
    part: &LoraPart,
    site: Site,
    r: usize,
    s: T,
) {
    let (t, inp, out) = (site.t, part.inp, part.out);
    let dy = MatRef::rows(&dy[site.col..], t, out, site.ld);
    let (a, b) = (&ad[part.a.clone()], &ad[part.b.clone()]);
    // dB = s dy^T u; du = s dy B; dA = du^T x; dx += du A.
    matmul_par(MatMut::rows(&mut d_ad[part.b.clone()], out, r, r), dy.t(), MatRef::rows(u, t, r, r), s, false);
    let du = product_new(dy, MatRef::rows(b, out, r, r), s, true);
    let du = MatRef::rows(&du, t, r, r);
    matmul_par(
        MatMut::rows(&mut d_ad[part.a.clone()], r, inp, inp),
        du.t(),
        MatRef::rows(x, t, inp, inp),
        T::ONE,
        false,
    );
    matmul_par(MatMut::rows(dx, t, inp, inp), du, MatRef::rows(a, r, inp, inp), T::ONE, true);
}
