//! Sampling one token from logits with temperature, top-k and top-p, reporting the log-probability
//! under the temperature-scaled distribution (what the trainer recomputes as `log_softmax(z / T)`).

use crate::rng::SplitMix64;

/// A seeded sampler (SplitMix64, so a seed gives the same sample everywhere).
#[derive(Debug, Clone)]
pub struct Sampler {
    temperature: f32,
    top_p: f32,
    top_k: Option<usize>,
    min_p: f32,
    rng: SplitMix64,
}

/// Logit adjustments made before temperature and sampling, as vLLM makes them: a repetition
/// penalty over prompt and output tokens (positive logits divided by it, negative ones
/// multiplied), frequency and presence penalties over output tokens (`count * frequency +
/// presence`, subtracted), then a per-token bias. Reported logprobs are those of the adjusted,
/// temperature-scaled distribution: the one actually sampled from.
#[derive(Debug, Clone, PartialEq)]
pub struct Penalties {
    /// OpenAI `presence_penalty`, in [-2, 2].
    pub presence: f32,
    /// OpenAI `frequency_penalty`, in [-2, 2].
    pub frequency: f32,
    /// vLLM/HF `repetition_penalty`, > 0 (1 = off).
    pub repetition: f32,
    /// OpenAI `logit_bias`: (token id, bias in [-100, 100]).
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for Penalties {
    fn default() -> Self {
        Penalties { presence: 0.0, frequency: 0.0, repetition: 1.0, logit_bias: Vec::new() }
    }
}

impl Penalties {
    /// Whether applying changes nothing.
    pub fn is_off(&self) -> bool {
        self.presence == 0.0 && self.frequency == 0.0 && self.repetition == 1.0 && self.logit_bias.is_empty()
    }

    /// Adjusts `logits` for a sequence of `prompt` followed by `output` so far.
    pub fn apply(&self, logits: &mut [f32], prompt: &[u32], output: &[u32]) {
        if self.repetition != 1.0 {
            let mut seen = vec![false; logits.len()];
            for &t in prompt.iter().chain(output) {
                if let Some(flag) = seen.get_mut(t as usize) {
                    *flag = true;
                }
            }
            for (z, _) in logits.iter_mut().zip(&seen).filter(|(_, s)| **s) {
                *z = if *z > 0.0 { *z / self.repetition } else { *z * self.repetition };
            }
        }
        if self.presence != 0.0 || self.frequency != 0.0 {
            let mut counts = std::collections::HashMap::<u32, u32>::new();
            for &t in output {
                *counts.entry(t).or_default() += 1;
            }
            for (t, n) in counts {
                if let Some(z) = logits.get_mut(t as usize) {
                    *z -= self.frequency * n as f32 + self.presence;
                }
            }
        }
        for &(t, bias) in &self.logit_bias {
            if let Some(z) = logits.get_mut(t as usize) {
                *z += bias;
            }
        }
    }
}

/// `log_softmax(logits / t)` (t = 1 when `temperature` is 0).
pub fn log_softmax(logits: &[f32], temperature: f32) -> Vec<f32> {
    let t = if temperature > 0.0 { temperature } else { 1.0 };
    let scaled: Vec<f32> = logits.iter().map(|z| z / t).collect();
    let max = scaled.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = scaled.iter().map(|z| f64::from(z - max).exp()).sum();
    let lse = max + sum.ln() as f32;
    scaled.iter().map(|z| z - lse).collect()
}

impl Sampler {
    /// A sampler; `temperature` 0 is greedy.
    pub fn new(temperature: f32, top_p: f32, top_k: Option<usize>, seed: u64) -> Self {
        Sampler {
            temperature,
            top_p,
            top_k: top_k.filter(|k| *k > 0),
            min_p: 0.0,
            rng: SplitMix64::new(seed ^ 0x5851_f42d_4c95_7f2d),
        }
    }

    /// Also drops tokens less likely than `min_p` times the most likely one (vLLM `min_p`).
    pub fn with_min_p(mut self, min_p: f32) -> Self {
        self.min_p = min_p;
        self
    }

    /// Picks a token; returns it with its log-probability under `softmax(logits / T)`.
    pub fn sample(&mut self, logits: &[f32]) -> (u32, f32) {
        let logp = log_softmax(logits, self.temperature);
        if self.temperature <= 0.0 {
            let (best, _) = logp
                .iter()
                .enumerate()
                .fold((0, f32::NEG_INFINITY), |acc, (i, &l)| if l > acc.1 { (i, l) } else { acc });
            return (best as u32, logp[best]);
        }
        let mut order: Vec<usize> = (0..logp.len()).collect();
        order.sort_unstable_by(|&a, &b| logp[b].total_cmp(&logp[a]).then(a.cmp(&b)));
        if let Some(k) = self.top_k {
            order.truncate(k.max(1));
        }
        let mut kept = Vec::with_capacity(order.len());
        let mut mass = 0.0f64;
        for &i in &order {
            kept.push(i);
            mass += f64::from(logp[i]).exp();
            if mass >= f64::from(self.top_p) {
                break;
            }
        }
        if self.min_p > 0.0 {
            let floor = f64::from(logp[order[0]]).exp() * f64::from(self.min_p);
            kept.retain(|&i| f64::from(logp[i]).exp() >= floor);
        }
        let total: f64 = kept.iter().map(|&i| f64::from(logp[i]).exp()).sum();
        let mut u = self.rng.uniform() * total;
        for &i in &kept {
            u -= f64::from(logp[i]).exp();
            if u <= 0.0 {
                return (i as u32, logp[i]);
            }
        }
        let last = *kept.last().expect("at least one token is kept");
        (last as u32, logp[last])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_of_the_temperature_scaled_distribution() {
        let logits = [1.0f32, 2.0, 3.0];
        let lp = log_softmax(&logits, 2.0);
        let z: Vec<f64> = [0.5f64, 1.0, 1.5].iter().map(|x| x.exp()).collect();
        let s: f64 = z.iter().sum();
        for (l, zi) in lp.iter().zip(&z) {
            assert!((f64::from(*l) - (zi / s).ln()).abs() < 1e-6);
        }
    }

    #[test]
    fn penalties_follow_vllm_and_min_p_keeps_only_likely_tokens() {
        let mut z = vec![2.0f32, -1.0, 0.5, 3.0];
        let p = Penalties { presence: 0.5, frequency: 0.25, repetition: 2.0, logit_bias: vec![(2, 10.0)] };
        // Token 0 in the prompt only, token 3 twice in the output, token 1 once.
        p.apply(&mut z, &[0], &[3, 3, 1]);
        assert_eq!(z, vec![1.0, -2.0 - 0.25 - 0.5, 10.5, 1.5 - 0.5 - 0.5]);
        assert!(Penalties::default().is_off() && !p.is_off());
        // Probabilities ~0.64, 0.24, 0.09, 0.03: min_p 0.3 keeps the first two only.
        let logits = [3.0f32, 2.0, 1.0, 0.0];
        let mut s = Sampler::new(1.0, 1.0, None, 5).with_min_p(0.3);
        assert!((0..200).all(|_| s.sample(&logits).0 <= 1));
        let mut s = Sampler::new(1.0, 1.0, None, 5);
        assert!((0..200).any(|_| s.sample(&logits).0 >= 2), "without min_p the tail is sampled");
    }

    #[test]
    fn same_seed_same_samples_and_greedy_takes_the_max() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let draw = |seed| {
            let mut s = Sampler::new(1.0, 1.0, None, seed);
            (0..20).map(|_| s.sample(&logits).0).collect::<Vec<_>>()
        };
        assert_eq!(draw(3), draw(3));
        assert_ne!(draw(3), draw(4));
        let (tok, _) = Sampler::new(0.0, 1.0, None, 0).sample(&[0.1, 5.0, 0.2]);
        assert_eq!(tok, 1);
        let mut s = Sampler::new(1.0, 1.0, Some(1), 9);
        assert!((0..10).all(|_| s.sample(&[0.1, 5.0, 0.2]).0 == 1), "top-k 1 is greedy");
    }
}
