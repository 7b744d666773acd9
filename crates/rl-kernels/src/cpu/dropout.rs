//! Adapter dropout (PEFT's `lora_dropout`): every element of an adapter's input is zeroed with
//! probability `p` and the rest scaled by `1 / (1 - p)`. The mask is a pure function of a seed
//! and the element's index (a counter-based generator), so the backward regenerates the mask the
//! forward drew instead of storing it, the fused and the composed layer draw the same one, and a
//! resumed run draws what the uninterrupted one did.

use rayon::prelude::*;

use crate::cpu::lora::Proj;
use crate::float::Real;

/// Dropout on one layer pass's adapter inputs. Each adapted projection draws its own mask (PEFT
/// has one dropout module per adapted projection, so q, k and v see different masks of the same
/// input).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dropout {
    /// Probability of zeroing an element, in `[0, 1)`.
    pub p: f64,
    /// Seeds this pass's masks (one per layer and micro-batch: see [`Dropout::for_layer`]).
    pub seed: u64,
}

/// SplitMix64's output function: a bijection of `u64` whose outputs pass for independent
/// uniform draws for consecutive inputs.
#[inline(always)]
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// Rows per parallel task when a mask is applied.
const ROWS_PER_TASK: usize = 16;

impl Dropout {
    /// Whether it drops anything.
    pub fn is_active(&self) -> bool {
        self.p > 0.0
    }

    /// The dropout of decoder layer `layer` of a pass seeded `self.seed`.
    pub fn for_layer(self, layer: usize) -> Dropout {
        Dropout { p: self.p, seed: mix(self.seed ^ mix((layer as u64).wrapping_add(1).wrapping_mul(GOLDEN))) }
    }

    /// The stream of projection `proj`'s mask.
    fn stream(&self, proj: Proj) -> u64 {
        mix(self.seed.wrapping_add((proj as u64 + 1).wrapping_mul(GOLDEN)))
    }

    /// Draws at or above this are kept: `p` of the `u64` range falls below it.
    fn threshold(&self) -> u64 {
        // p < 1, so the product is below 2^64; `as` saturates at the top anyway.
        (self.p * 18_446_744_073_709_551_616.0) as u64
    }

    /// Whether element `i` of projection `proj`'s input is kept.
    #[inline(always)]
    fn keeps(stream: u64, threshold: u64, i: usize) -> bool {
        mix(stream.wrapping_add((i as u64).wrapping_mul(GOLDEN))) >= threshold
    }

    /// `mask(proj) * x / (1 - p)` for `x` of rows of `cols` (the mask's element index is the
    /// index into `x`).
    pub fn apply<T: Real>(&self, proj: Proj, x: &[T], cols: usize) -> Vec<T> {
        let mut out = x.to_vec();
        self.apply_in_place(proj, &mut out, cols);
        out
    }

    /// [`Dropout::apply`] in place: the forward's dropped input, and the backward's gradient
    /// through the same mask.
    pub fn apply_in_place<T: Real>(&self, proj: Proj, x: &mut [T], cols: usize) {
        let (stream, threshold) = (self.stream(proj), self.threshold());
        let keep_scale = T::of(1.0 / (1.0 - self.p));
        let cols = cols.max(1);
        x.par_chunks_mut(cols * ROWS_PER_TASK).enumerate().for_each(|(c, block)| {
            let start = c * cols * ROWS_PER_TASK;
            for (j, v) in block.iter_mut().enumerate() {
                *v = if Self::keeps(stream, threshold, start + j) { *v * keep_scale } else { T::ZERO };
            }
        });
    }

    /// The mask of projection `proj` over `n` elements as multipliers (`0` or `1 / (1 - p)`),
    /// for the composed layer, which multiplies tensors (in f64: cast to the input's dtype, the
    /// scale rounds as the fused layer's does).
    pub fn multipliers(&self, proj: Proj, n: usize) -> Vec<f64> {
        let (stream, threshold) = (self.stream(proj), self.threshold());
        let keep = 1.0 / (1.0 - self.p);
        (0..n).map(|i| if Self::keeps(stream, threshold, i) { keep } else { 0.0 }).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_about_p_and_scales_the_rest() {
        let d = Dropout { p: 0.25, seed: 7 };
        let x = vec![1.0f32; 64 * 1000];
        let y = d.apply(Proj::Q, &x, 64);
        let kept = y.iter().filter(|&&v| v != 0.0).count() as f64 / y.len() as f64;
        assert!((kept - 0.75).abs() < 0.01, "kept {kept}");
        assert!(y.iter().all(|&v| v == 0.0 || (v - 4.0 / 3.0).abs() < 1e-6));
        // The expectation is kept: the mean stays near 1.
        let mean = y.iter().map(|&v| f64::from(v)).sum::<f64>() / y.len() as f64;
        assert!((mean - 1.0).abs() < 0.02, "mean {mean}");
    }

    #[test]
    fn masks_are_a_function_of_seed_layer_and_projection() {
        let d = Dropout { p: 0.5, seed: 3 };
        let x = vec![1.0f64; 4096];
        let m = |d: Dropout, p: Proj| d.apply(p, &x, 64);
        assert_eq!(m(d, Proj::Q), m(d, Proj::Q), "the same draw twice");
        assert_ne!(m(d, Proj::Q), m(d, Proj::K), "each projection its own mask");
        assert_ne!(m(d.for_layer(0), Proj::Q), m(d.for_layer(1), Proj::Q), "each layer its own mask");
        assert_ne!(m(d, Proj::Q), m(Dropout { seed: 4, ..d }, Proj::Q), "each seed its own mask");
        // The multipliers are the same mask.
        let mult = d.multipliers(Proj::V, x.len());
        let applied = m(d, Proj::V);
        assert!(mult.iter().zip(&applied).all(|(a, b)| a == b));
        // Nothing is dropped at p = 0.
        assert_eq!(m(Dropout { p: 0.0, seed: 3 }, Proj::Q), x);
        assert!(!Dropout { p: 0.0, seed: 3 }.is_active());
    }
}
