//! The engine's prompt cache (vLLM's automatic prefix caching, at prompt granularity): the keys and
//! values of recently prefilled prompts, minus each prompt's last token, so that a request whose
//! prompt starts with a kept one prefills only the rest. The last prompt token is always fed again:
//! its logits give the first completion token. A GRPO group's requests (same prompt) prefill once;
//! a multi-turn episode's next turn reuses its history. Bounded in bytes, least recently used out
//! first; the engine clears it whenever the weights change.

use rl_model::Runtime;

struct Entry<P> {
    tokens: Vec<u32>,
    prefix: P,
    used_at: u64,
}

/// Cached prompt prefixes of runtime `R` within a byte budget.
pub(crate) struct PrefixCache<R: Runtime> {
    entries: Vec<Entry<R::Prefix>>,
    budget: usize,
    used: usize,
    clock: u64,
}

impl<R: Runtime> PrefixCache<R> {
    /// An empty cache holding at most `budget` bytes (0 = never keeps anything).
    pub(crate) fn new(budget: usize) -> Self {
        PrefixCache { entries: Vec::new(), budget, used: 0, clock: 0 }
    }

    /// Whether anything can be kept at all.
    pub(crate) fn enabled(&self) -> bool {
        self.budget > 0
    }

    /// The longest kept prefix that leaves at least one token of `prompt` to feed.
    pub(crate) fn lookup(&mut self, prompt: &[u32]) -> Option<R::Prefix> {
        self.clock += 1;
        let best = self
            .entries
            .iter_mut()
            .filter(|e| e.tokens.len() < prompt.len() && prompt.starts_with(&e.tokens))
            .max_by_key(|e| e.tokens.len())?;
        best.used_at = self.clock;
        Some(best.prefix.clone())
    }

    /// Keeps `prefix` as the keys and values of `tokens`, evicting the least recently used entries
    /// to stay within the budget. An entry larger than the whole budget is not kept.
    pub(crate) fn insert(&mut self, tokens: Vec<u32>, prefix: R::Prefix) {
        let bytes = R::prefix_bytes(&prefix);
        if tokens.is_empty() || bytes > self.budget || self.entries.iter().any(|e| e.tokens == tokens) {
            return;
        }
        while self.used + bytes > self.budget {
            let Some(oldest) = self.entries.iter().enumerate().min_by_key(|(_, e)| e.used_at).map(|(i, _)| i) else {
                break;
            };
            self.used -= R::prefix_bytes(&self.entries.swap_remove(oldest).prefix);
        }
        self.clock += 1;
        self.used += bytes;
        self.entries.push(Entry { tokens, prefix, used_at: self.clock });
    }

    /// Drops everything (the weights changed, so every kept key and value is stale).
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.used = 0;
    }

    /// Bytes held.
    #[cfg(test)]
    pub(crate) fn used(&self) -> usize {
        self.used
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use candle_core::{Device, Tensor};
    use rl_model::{CpuRuntime, ModelConfig, Preset, Trainable};

    use super::PrefixCache;

    fn runtime() -> CpuRuntime {
        let cfg = ModelConfig::preset(Preset::Tiny, 40);
        let map: HashMap<String, Tensor> = rl_model::random_weights(&cfg, 1).unwrap().into_iter().collect();
        let model = Trainable::from_tensors(&cfg, &map).unwrap().model(&cfg, &Device::Cpu).unwrap();
        CpuRuntime::new(&model).unwrap()
    }

    #[test]
    fn longest_strict_prefix_wins_and_the_budget_evicts_least_recent() {
        let rt = runtime();
        let prefix_of = |tokens: &[u32]| {
            let mut c = rt.new_cache(None, tokens.len());
            rt.forward(&mut [&mut c], &[tokens], false).unwrap();
            c.share_first(tokens.len())
        };
        let (a, ab) = (vec![1, 2, 3], vec![1, 2, 3, 4, 5]);
        let one = prefix_of(&a).bytes();
        let mut cache = PrefixCache::<CpuRuntime>::new(one * 3);
        cache.insert(a.clone(), prefix_of(&a));
        cache.insert(ab.clone(), prefix_of(&ab));
        assert_eq!(cache.lookup(&[1, 2, 3, 4, 5, 6]).unwrap().len(), 5, "the longest kept prefix");
        assert_eq!(cache.lookup(&[1, 2, 3, 4, 5]).unwrap().len(), 3, "a whole prompt is never a hit");
        assert!(cache.lookup(&[2, 3]).is_none());
        // `ab` (5 tokens) was used less recently than `a`: a new entry pushes it out.
        let c = vec![7, 8, 9];
        cache.insert(c.clone(), prefix_of(&c));
        assert_eq!(cache.used(), 2 * one);
        assert_eq!(cache.lookup(&[1, 2, 3, 4, 5, 6]).unwrap().len(), 3);
        assert!(cache.lookup(&[7, 8, 9, 1]).is_some());
        cache.clear();
        assert!(cache.lookup(&[7, 8, 9, 1]).is_none());
        assert_eq!(cache.used(), 0);
        let mut none = PrefixCache::<CpuRuntime>::new(0);
        none.insert(a.clone(), prefix_of(&a));
        assert!(none.lookup(&ab).is_none(), "a zero budget keeps nothing");
    }
}
