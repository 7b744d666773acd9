//! Sampling one token from logits with temperature, top-k and top-p, reporting the log-probability
//! under the temperature-scaled distribution (what the trainer recomputes as `log_softmax(z / T)`).

use crate::rng::SplitMix64;

/// A seeded sampler (SplitMix64, so a seed gives the same sample everywhere).
#[derive(Debug, Clone)]
pub struct Sampler {
    temperature: f32,
    top_p: f32,
    top_k: Option<usize>,
    rng: SplitMix64,
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
            rng: SplitMix64::new(seed ^ 0x5851_f42d_4c95_7f2d),
        }
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
