//! A whole decoder layer (pre-norm attention block, then pre-norm SwiGLU block, both residual),
//! forward and backward, on plain slices: the kernels of this module's siblings chained with every
//! buffer in place. As one op, the layer costs candle's autograd one gradient buffer for its
//! input and one for its weights; as a graph of a dozen ops it cost a zero-filled buffer plus an
//! addition pass for every input of every op. The three projections q/k/v are one product with
//! the stacked weight (so are gate/up), and the residual additions are the products' own
//! accumulation.
//!
//! Weights travel as one flat buffer in the order [`LayerShape::parts`] documents.

use std::ops::Range;

use crate::cpu::attention::{Qkv, backward_packed, forward};
use crate::cpu::dropout::Dropout;
pub use crate::cpu::layer_shape::{LayerParts, LayerShape};
use crate::cpu::lora::{LoraPart, LoraShape, Proj, Site, lora_backward, lora_forward};
use crate::cpu::norm::{RopeTables, heads_norm_rope_backward, heads_norm_rope_forward};
use crate::cpu::norm::{rms_norm_backward, rms_norm_forward};
use crate::cpu::swiglu::{swiglu_packed_backward, swiglu_packed_forward};
use crate::float::Real;
use crate::gemm::{MatMut, MatRef, matmul_par, product_new};
use crate::layout::RowLayout;

/// What the forward keeps for the backward (all token-major).
#[derive(Debug)]
pub struct Saved<T> {
    /// Normed input `[T, hidden]`.
    pub h1: Vec<T>,
    /// Projected q/k/v before norm and rotation `[T, qkv_width]`.
    pub qkv_pre: Vec<T>,
    /// After them (what attention read).
    pub qkv: Vec<T>,
    /// Attention output `[T, Hq d]`.
    pub o: Vec<T>,
    /// Its log-sum-exp `[T, Hq]`.
    pub lse: Vec<T>,
    /// The residual stream after attention `[T, hidden]`.
    pub x2: Vec<T>,
    /// Its norm `[T, hidden]`.
    pub h2: Vec<T>,
    /// Gate/up projections `[T, 2 intermediate]`.
    pub gu: Vec<T>,
    /// SwiGLU output `[T, intermediate]`.
    pub act: Vec<T>,
    /// Each adapter's `x A^T` (`[T, r]`), in [`LoraShape::parts`] order.
    pub lora_u: Vec<Vec<T>>,
}

/// A layer pass's adapters: the flat buffer, its shape and the dropout on their inputs.
#[derive(Debug, Clone, Copy)]
pub struct Adapters<'a, T> {
    /// `A` and `B` of every adapted projection ([`LoraShape::parts`]).
    pub values: &'a [T],
    /// Rank, scale and targets.
    pub shape: LoraShape,
    /// Dropout on each adapter's input (a training pass; `None` evaluates).
    pub dropout: Option<Dropout>,
}

impl<T: Real> Adapters<'_, T> {
    /// The parts adapting any of `projs`, with their index in [`LoraShape::parts`].
    fn parts_of(&self, sh: &LayerShape, projs: &[Proj]) -> Vec<(usize, LoraPart)> {
        self.shape.parts(sh).into_iter().enumerate().filter(|(_, p)| projs.contains(&p.proj)).collect()
    }

    fn scale(&self) -> T {
        T::of(self.shape.scale)
    }

    /// The active dropout, if any.
    fn dropout(&self) -> Option<Dropout> {
        self.dropout.filter(Dropout::is_active)
    }
}

/// Adds the adapters of `projs` (reading `x`) into `y` (rows of `ld`), keeping each `x A^T`.
fn adapt<T: Real>(
    ad: Option<&Adapters<'_, T>>,
    sh: &LayerShape,
    projs: &[Proj],
    y: &mut [T],
    x: &[T],
    ld: usize,
    u: &mut [Vec<T>],
) {
    let Some(ad) = ad else { return };
    let t = y.len() / ld;
    for (i, part) in ad.parts_of(sh, projs) {
        let site = Site { t, ld, col: part.proj.column(sh) };
        u[i] = match ad.dropout() {
            None => lora_forward(y, x, ad.values, &part, site, ad.shape.rank, ad.scale()),
            Some(d) => {
                let xd = d.apply(part.proj, x, part.inp);
                lora_forward(y, &xd, ad.values, &part, site, ad.shape.rank, ad.scale())
            }
        };
    }
}

/// The backward of [`adapt`]: adapter gradients into `d_ad`, the input's into `dx`.
#[allow(clippy::too_many_arguments)]
fn adapt_backward<T: Real>(
    ad: Option<&Adapters<'_, T>>,
    sh: &LayerShape,
    projs: &[Proj],
    dy: &[T],
    x: &[T],
    u: &[Vec<T>],
    d_ad: &mut [T],
    dx: &mut [T],
    ld: usize,
) {
    let Some(ad) = ad else { return };
    let t = dy.len() / ld;
    for (i, part) in ad.parts_of(sh, projs) {
        let site = Site { t, ld, col: part.proj.column(sh) };
        let (r, s) = (ad.shape.rank, ad.scale());
        match ad.dropout() {
            None => lora_backward(dy, x, &u[i], ad.values, d_ad, dx, &part, site, r, s),
            Some(d) => {
                // The adapter saw `mask * x`: its gradients read that input again (the same
                // draw), and the input's gradient goes back through the same mask.
                let xd = d.apply(part.proj, x, part.inp);
                let mut dxd = crate::cpu::zeroed(dx.len());
                lora_backward(dy, &xd, &u[i], ad.values, d_ad, &mut dxd, &part, site, r, s);
                d.apply_in_place(part.proj, &mut dxd, part.inp);
                dx.iter_mut().zip(&dxd).for_each(|(a, b)| *a += *b);
            }
        }
    }
}

/// Everything a layer pass needs besides the activations.
#[derive(Debug, Clone, Copy)]
pub struct LayerCtx<'a, T> {
    /// Sizes and parts.
    pub shape: LayerShape,
    /// The packed row's attention pattern.
    pub layout: &'a RowLayout,
    /// Each token's position.
    pub positions: &'a [u32],
    /// Rotary tables.
    pub rope: RopeTables<'a, T>,
    /// Attention scale.
    pub scale: T,
}

/// Adds `b` to every row of `x` (rows of `b.len()`).
fn add_rows<T: Real>(x: &mut [T], b: &[T]) {
    for row in x.chunks_mut(b.len()) {
        row.iter_mut().zip(b).for_each(|(x, b)| *x += *b);
    }
}

/// Column sums of `x` (rows of `out.len()`) into `out`.
fn column_sums<T: Real>(x: &[T], out: &mut [T]) {
    for row in x.chunks(out.len()) {
        out.iter_mut().zip(row).for_each(|(o, v)| *o += *v);
    }
}

/// `y = x W^T` as a new buffer, `W` rows `r` of the flat weights (`out x inp`).
fn project<T: Real>(x: &[T], w: &[T], r: &Range<usize>, t: usize, inp: usize) -> Vec<T> {
    let out = r.len() / inp;
    product_new(MatRef::rows(x, t, inp, inp), MatRef::rows(&w[r.clone()], out, inp, inp).t(), T::ONE, true)
}

/// `y += x W^T` (the residual stream takes a projection in place).
fn project_onto<T: Real>(y: &mut [T], x: &[T], w: &[T], r: &Range<usize>, t: usize, inp: usize) {
    let out = r.len() / inp;
    let wt = MatRef::rows(&w[r.clone()], out, inp, inp).t();
    matmul_par(MatMut::rows(y, t, out, out), MatRef::rows(x, t, inp, inp), wt, T::ONE, true);
}

const QKV: [Proj; 3] = [Proj::Q, Proj::K, Proj::V];
const GATE_UP: [Proj; 2] = [Proj::Gate, Proj::Up];

/// The layer's output `[T, hidden]` for input `x`, flat weights `w` and adapters `ad`, and what
/// its backward needs.
pub fn layer_forward<T: Real>(
    x: &[T],
    w: &[T],
    ad: Option<&Adapters<'_, T>>,
    ctx: &LayerCtx<'_, T>,
) -> (Vec<T>, Saved<T>) {
    let sh = ctx.shape;
    let (h, t, width, inter) = (sh.hidden, ctx.positions.len(), sh.qkv_width(), sh.intermediate);
    let p = sh.parts();
    assert!(x.len() == t * h && w.len() == p.down.end, "decoder layer: buffers do not match the shape");
    assert!(ad.is_none_or(|a| a.values.len() == a.shape.len(&sh)), "decoder layer: adapters do not match the shape");
    let mut lora_u = vec![Vec::new(); ad.map_or(0, |a| a.shape.parts(&sh).len())];
    let h1 = rms_norm_forward(x, &w[p.ln1.clone()], sh.eps);
    let mut qkv_pre = project(&h1, w, &p.qkv, t, h);
    if sh.qkv_bias {
        add_rows(&mut qkv_pre, &w[p.qkv_bias.clone()]);
    }
    adapt(ad, &sh, &QKV, &mut qkv_pre, &h1, width, &mut lora_u);
    let spans = sh.spans(w, &p);
    let qkv = heads_norm_rope_forward(&qkv_pre, width, sh.attn.head_dim, &spans, sh.eps, ctx.positions, ctx.rope);
    let (o, lse) = forward(ctx.layout, sh.attn, Qkv::packed(&qkv, sh.attn), ctx.scale);
    let mut x2 = x.to_vec();
    if sh.o_bias {
        add_rows(&mut x2, &w[p.o_bias.clone()]);
    }
    project_onto(&mut x2, &o, w, &p.o, t, sh.attn.ldq());
    adapt(ad, &sh, &[Proj::O], &mut x2, &o, h, &mut lora_u);
    let h2 = rms_norm_forward(&x2, &w[p.ln2.clone()], sh.eps);
    let mut gu = project(&h2, w, &p.gate_up, t, h);
    adapt(ad, &sh, &GATE_UP, &mut gu, &h2, 2 * inter, &mut lora_u);
    let act = swiglu_packed_forward(&gu, inter);
    let mut out = x2.clone();
    project_onto(&mut out, &act, w, &p.down, t, inter);
    adapt(ad, &sh, &[Proj::Down], &mut out, &act, h, &mut lora_u);
    (out, Saved { h1, qkv_pre, qkv, o, lse, x2, h2, gu, act, lora_u })
}

/// `dW = dy^T x` straight into the weight gradient's rows `r` (`out x inp`).
fn weight_grad<T: Real>(dw: &mut [T], r: &Range<usize>, dy: &[T], x: &[T], t: usize, inp: usize) {
    let out = r.len() / inp;
    let dst = MatMut::rows(&mut dw[r.clone()], out, inp, inp);
    matmul_par(dst, MatRef::rows(dy, t, out, out).t(), MatRef::rows(x, t, inp, inp), T::ONE, false);
}

/// `dx = dy W` for the weight's rows `r` (`out x inp`) as a new `[T, inp]` buffer.
fn input_grad<T: Real>(dy: &[T], w: &[T], r: &Range<usize>, t: usize, inp: usize) -> Vec<T> {
    let out = r.len() / inp;
    product_new(MatRef::rows(dy, t, out, out), MatRef::rows(&w[r.clone()], out, inp, inp), T::ONE, true)
}

/// Which gradients a layer backward computes: of the weights (not when they are frozen under
/// adapters: no weight-gradient product runs) and of the adapters.
#[derive(Debug, Clone, Copy)]
pub struct Wanted {
    /// The flat weights' gradient.
    pub weights: bool,
}

/// Gradients of [`layer_forward`] given the output's gradient `dy`: the input's, the weights'
/// (when `want.weights`) and the adapters' (when `ad` is given).
pub fn layer_backward<T: Real>(
    x: &[T],
    w: &[T],
    ad: Option<&Adapters<'_, T>>,
    s: &Saved<T>,
    dy: &[T],
    ctx: &LayerCtx<'_, T>,
    want: Wanted,
) -> (Vec<T>, Option<Vec<T>>, Option<Vec<T>>) {
    let sh = ctx.shape;
    let (h, t, width, inter, qd) = (sh.hidden, ctx.positions.len(), sh.qkv_width(), sh.intermediate, sh.attn.ldq());
    let p = sh.parts();
    assert!(dy.len() == t * h && w.len() == p.down.end, "decoder layer: gradient does not match the shape");
    let mut dw = want.weights.then(|| crate::cpu::zeroed(w.len()));
    let mut d_ad = ad.map(|a| crate::cpu::zeroed(a.values.len()));
    macro_rules! d_ad {
        () => {
            d_ad.as_deref_mut().unwrap_or(&mut [])
        };
    }
    // MLP block: out = x2 + swiglu(h2 Wgu^T) Wd^T.
    let mut d_act = input_grad(dy, w, &p.down, t, inter);
    adapt_backward(ad, &sh, &[Proj::Down], dy, &s.act, &s.lora_u, d_ad!(), &mut d_act, h);
    if let Some(dw) = dw.as_mut() {
        weight_grad(dw, &p.down, dy, &s.act, t, inter);
    }
    let d_gu = swiglu_packed_backward(&s.gu, &d_act, inter);
    drop(d_act);
    let mut d_h2 = input_grad(&d_gu, w, &p.gate_up, t, h);
    adapt_backward(ad, &sh, &GATE_UP, &d_gu, &s.h2, &s.lora_u, d_ad!(), &mut d_h2, 2 * inter);
    if let Some(dw) = dw.as_mut() {
        weight_grad(dw, &p.gate_up, &d_gu, &s.h2, t, h);
    }
    drop(d_gu);
    let (mut d_x2, d_ln2) = rms_norm_backward(&s.x2, &w[p.ln2.clone()], &d_h2, sh.eps);
    if let Some(dw) = dw.as_mut() {
        dw[p.ln2.clone()].copy_from_slice(&d_ln2);
    }
    d_x2.iter_mut().zip(dy).for_each(|(a, b)| *a += *b);
    // Attention block: x2 = x + attn(norm-rope(h1 Wqkv^T + b)) Wo^T + bo.
    if let Some(dw) = dw.as_mut()
        && sh.o_bias
    {
        column_sums(&d_x2, &mut dw[p.o_bias.clone()]);
    }
    let mut d_o = input_grad(&d_x2, w, &p.o, t, qd);
    adapt_backward(ad, &sh, &[Proj::O], &d_x2, &s.o, &s.lora_u, d_ad!(), &mut d_o, h);
    if let Some(dw) = dw.as_mut() {
        weight_grad(dw, &p.o, &d_x2, &s.o, t, qd);
    }
    let d_qkv = backward_packed(ctx.layout, sh.attn, &s.qkv, &s.o, &s.lse, &d_o, ctx.scale);
    drop(d_o);
    let spans = sh.spans(w, &p);
    let (d_pre, d_norms) =
        heads_norm_rope_backward(&s.qkv_pre, &d_qkv, width, sh.attn.head_dim, &spans, sh.eps, ctx.positions, ctx.rope);
    drop(d_qkv);
    if let Some(dw) = dw.as_mut() {
        if sh.qk_norm {
            dw[p.q_norm.clone()].copy_from_slice(&d_norms[0]);
            dw[p.k_norm.clone()].copy_from_slice(&d_norms[1]);
        }
        if sh.qkv_bias {
            column_sums(&d_pre, &mut dw[p.qkv_bias.clone()]);
        }
    }
    let mut d_h1 = input_grad(&d_pre, w, &p.qkv, t, h);
    adapt_backward(ad, &sh, &QKV, &d_pre, &s.h1, &s.lora_u, d_ad!(), &mut d_h1, width);
    if let Some(dw) = dw.as_mut() {
        weight_grad(dw, &p.qkv, &d_pre, &s.h1, t, h);
    }
    drop(d_pre);
    let (d_x, d_ln1) = rms_norm_backward(x, &w[p.ln1.clone()], &d_h1, sh.eps);
    if let Some(dw) = dw.as_mut() {
        dw[p.ln1.clone()].copy_from_slice(&d_ln1);
    }
    let mut d_x = d_x;
    d_x.iter_mut().zip(&d_x2).for_each(|(a, b)| *a += *b);
    (d_x, dw, d_ad)
}
