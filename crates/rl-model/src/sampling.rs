//! Sampling one token from logits with temperature, top-k and top-p, reporting the log-probability
//! under the temperature-scaled distribution (what the trainer recomputes as `log_softmax(z / T)`).

use rl_configs::Temperature;

use crate::rng::SplitMix64;

/// A seeded sampler (SplitMix64, so a seed gives the same sample everywhere).
#[derive(Debug, Clone)]
pub struct Sampler {
    temperature: Temperature,
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

/// `log_softmax(logits / t)` for a divisor `t > 0` (a [`Temperature`]'s
/// [`Temperature::logprob_divisor`], or a trained token's temperature).
pub fn log_softmax(logits: &[f32], t: f32) -> Vec<f32> {
    let scaled: Vec<f32> = logits.iter().map(|z| z / t).collect();
    let max = scaled.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = scaled.iter().map(|z| f64::from(z - max).exp()).sum();
    let lse = max + sum.ln() as f32;
    scaled.iter().map(|z| z - lse).collect()
}

impl Sampler {
    /// A sampler at `temperature` (greedy picks the most likely token).
    pub fn new(temperature: Temperature, top_p: f32, top_k: Option<usize>, seed: u64) -> Self {
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
        if self.temperature.is_greedy() {
            let logp = log_softmax(logits, self.temperature.logprob_divisor());
            let (best, _) = logp
                .iter()
                .enumerate()
                .fold((0, f32::NEG_INFINITY), |acc, (i, &l)| if l > acc.1 { (i, l) } else { acc });
            return (best as u32, logp[best]);
        }
        // One pass of exponentials gives both the probabilities and (for the drawn token only)
        // the log-probability, computed as `log_softmax` computes it.
        let t = self.temperature.logprob_divisor();
        let scaled: Vec<f32> = logits.iter().map(|z| z / t).collect();
        let max = scaled.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut p: Vec<f64> = scaled.iter().map(|&z| f64::from(z - max).exp()).collect();
        let sum: f64 = p.iter().sum();
        let lse = max + sum.ln() as f32;
        p.iter_mut().for_each(|x| *x /= sum);
        let logp = |i: usize| scaled[i] - lse;
        let truncates = self.top_k.is_some_and(|k| k < p.len()) || self.top_p < 1.0 || self.min_p > 0.0;
        if !truncates {
            // The whole distribution: no order is needed to invert its CDF (sorting a 150k-entry
            // vocabulary per token cost more than a small model's forward).
            let i = self.draw(&p, 0..p.len());
            return (i as u32, logp(i));
        }
        let by_prob = |&a: &usize, &b: &usize| scaled[b].total_cmp(&scaled[a]).then(a.cmp(&b));
        let mut order = self.nucleus_candidates(&p);
        if let Some(k) = self.top_k.filter(|&k| k < order.len()) {
            // Only the k best need an order: partition them out first.
            let k = k.max(1);
            order.select_nth_unstable_by(k - 1, by_prob);
            order.truncate(k);
        }
        order.sort_unstable_by(by_prob);
        let mut kept = Vec::with_capacity(order.len());
        let mut mass = 0.0f64;
        for &i in &order {
            kept.push(i);
            mass += p[i];
            if mass >= f64::from(self.top_p) {
                break;
            }
        }
        if self.min_p > 0.0 {
            let floor = p[order[0]] * f64::from(self.min_p);
            kept.retain(|&i| p[i] >= floor);
        }
        let i = self.draw(&p, kept.into_iter());
        (i as u32, logp(i))
    }

    /// The tokens the top-p prefix of the sorted distribution can reach: those above a
    /// probability floor whose total mass already reaches `top_p` (every token of the prefix ranks
    /// above every token below the floor), lowering the floor until it does; all tokens when
    /// `top_p` is 1. Sorting these gives the same prefix as sorting the vocabulary, at a fraction
    /// of the cost (the floor usually leaves tens of tokens, not 150k).
    fn nucleus_candidates(&self, p: &[f64]) -> Vec<usize> {
        let all = || (0..p.len()).collect();
        if self.top_p >= 1.0 {
            return all();
        }
        let best = p.iter().copied().fold(0.0, f64::max);
        let mut floor = best * 1e-3;
        while floor > best * 1e-12 {
            let above: Vec<usize> = (0..p.len()).filter(|&i| p[i] > floor).collect();
            if above.iter().map(|&i| p[i]).sum::<f64>() >= f64::from(self.top_p) {
                return above;
            }
            floor *= 1e-3;
        }
        all()
    }

    /// One draw from the distribution `p` restricted to `kept` (renormalised).
    fn draw(&mut self, p: &[f64], kept: impl Iterator<Item = usize> + Clone) -> usize {
        let total: f64 = kept.clone().map(|i| p[i]).sum();
        let mut u = self.rng.uniform() * total;
        let mut last = None;
        for i in kept {
            if p[i] > 0.0 {
                last = Some(i);
                u -= p[i];
                if u <= 0.0 {
                    return i;
                }
            }
        }
        // Rounding can leave a sliver of `u`: the last token with any mass takes it.
        last.unwrap_or(0)
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
        let mut s = Sampler::new(Temperature::ONE, 1.0, None, 5).with_min_p(0.3);
        assert!((0..200).all(|_| s.sample(&logits).0 <= 1));
        let mut s = Sampler::new(Temperature::ONE, 1.0, None, 5);
        assert!((0..200).any(|_| s.sample(&logits).0 >= 2), "without min_p the tail is sampled");
    }

    /// Empirical frequencies of `n` draws.
    fn frequencies(s: &mut Sampler, logits: &[f32], n: usize) -> Vec<f64> {
        let mut f = vec![0.0; logits.len()];
        for _ in 0..n {
            f[s.sample(logits).0 as usize] += 1.0 / n as f64;
        }
        f
    }

    #[test]
    fn draws_follow_the_truncated_renormalised_distribution() {
        let logits = [0.5f32, 2.0, -1.0, 1.5, 0.0, 2.0];
        let p: Vec<f64> = log_softmax(&logits, 1.0).iter().map(|l| f64::from(*l).exp()).collect();
        // The reported log-probability is exactly `log_softmax`'s, on every path.
        for (top_p, top_k) in [(1.0, None), (0.9, None), (1.0, Some(2))] {
            let mut s = Sampler::new(Temperature::new(0.7).unwrap(), top_p, top_k, 4);
            let lp = log_softmax(&logits, 0.7);
            assert!((0..50).all(|_| {
                let (t, l) = s.sample(&logits);
                l == lp[t as usize]
            }));
        }
        // No truncation (the path without a sort): every token at its probability.
        let f = frequencies(&mut Sampler::new(Temperature::ONE, 1.0, None, 1), &logits, 40_000);
        for (got, want) in f.iter().zip(&p) {
            assert!((got - want).abs() < 0.01, "{f:?} vs {p:?}");
        }
        // top-k 3 (partitioned, then ordered): tokens 1, 5 (tied, 0.33 each) and 3, renormalised.
        let top: f64 = p[1] + p[5] + p[3];
        let f = frequencies(&mut Sampler::new(Temperature::ONE, 1.0, Some(3), 2), &logits, 40_000);
        for (i, got) in f.iter().enumerate() {
            let want = if [1, 3, 5].contains(&i) { p[i] / top } else { 0.0 };
            assert!((got - want).abs() < 0.01, "top-k: {f:?}");
        }
        // top-p just above the two tied best: the third is needed too, the rest never drawn.
        let f = frequencies(&mut Sampler::new(Temperature::ONE, (p[1] + p[5]) as f32 + 0.01, None, 3), &logits, 20_000);
        assert!(f[0] == 0.0 && f[2] == 0.0 && f[4] == 0.0 && f[3] > 0.0, "top-p: {f:?}");
    }

    #[test]
    fn same_seed_same_samples_and_greedy_takes_the_max() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let draw = |seed| {
            let mut s = Sampler::new(Temperature::ONE, 1.0, None, seed);
            (0..20).map(|_| s.sample(&logits).0).collect::<Vec<_>>()
        };
        assert_eq!(draw(3), draw(3));
        assert_ne!(draw(3), draw(4));
        let (tok, _) = Sampler::new(Temperature::GREEDY, 1.0, None, 0).sample(&[0.1, 5.0, 0.2]);
        assert_eq!(tok, 1);
        let mut s = Sampler::new(Temperature::ONE, 1.0, Some(1), 9);
        assert!((0..10).all(|_| s.sample(&[0.1, 5.0, 0.2]).0 == 1), "top-k 1 is greedy");
    }
}
