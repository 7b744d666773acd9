//! Greedy exact match of held-out replies: how many trained spans of examples the model
//! reproduces token for token when it decodes greedily from each span's gold context
//! (`data.balance.signal = "exact"`).

use rl_model::{CausalLm, CpuRuntime, Rows, SeqCache};

use crate::error::Result;
use crate::sft_rows::SftExample;

/// Spans decoded side by side in one batch (bounds the prefill's memory).
const SPANS_PER_BATCH: usize = 64;

/// Replies reproduced exactly, of those tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct ExactCount {
    /// Replies decoded exactly.
    pub(crate) hits: usize,
    /// Replies tried.
    pub(crate) replies: usize,
}

impl ExactCount {
    /// The Laplace-smoothed share of replies missed, `(misses + 1) / (replies + 2)`: in (0, 1)
    /// even for no reply or all of them, so no group's lag is zero or undefined.
    pub(crate) fn lag(&self) -> f64 {
        (self.replies - self.hits + 1) as f64 / (self.replies + 2) as f64
    }

    /// The share of replies reproduced exactly (0 for none tried).
    pub(crate) fn rate(&self) -> f64 {
        if self.replies == 0 { 0.0 } else { self.hits as f64 / self.replies as f64 }
    }
}

/// Each example's trained spans (maximal runs of trained tokens after at least one context
/// token, within `max_len` tokens) as `(example, start, end)`.
fn spans(examples: &[SftExample], max_len: usize) -> Vec<(usize, usize, usize)> {
    let mut out = Vec::new();
    for (e, ex) in examples.iter().enumerate() {
        let n = ex.ids.len().min(ex.mask.len()).min(max_len);
        let mut t = 0;
        while t < n {
            if !ex.mask[t] {
                t += 1;
                continue;
            }
            let start = t;
            while t < n && ex.mask[t] {
                t += 1;
            }
            if start > 0 {
                out.push((e, start, t));
            }
        }
    }
    out
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in row.iter().enumerate() {
        if *v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Decodes every trained span of `examples` greedily after its gold context (earlier turns as
/// written, not as the model would answer them) and counts the spans reproduced token for token.
/// A span stops decoding at its first wrong token (a model's LoRA adapters computed unmerged).
pub(crate) fn greedy_exact(model: &CausalLm, examples: &[SftExample]) -> Result<ExactCount> {
    let rt = CpuRuntime::new(model)?;
    let vocab = model.config().vocab_size;
    let all = spans(examples, model.config().max_position_embeddings);
    let mut count = ExactCount { hits: 0, replies: all.len() };
    for batch in all.chunks(SPANS_PER_BATCH) {
        let mut caches: Vec<SeqCache> = batch.iter().map(|&(_, _, end)| rt.new_cache(None, end)).collect();
        let prompts: Vec<&[u32]> = batch.iter().map(|&(e, start, _)| &examples[e].ids[..start]).collect();
        let mut refs: Vec<&mut SeqCache> = caches.iter_mut().collect();
        let mut logits = rt.forward_rows(&mut refs, &prompts, &vec![Rows::Last; batch.len()])?;
        // Each live span: its index in the batch and the position of the token it predicts next.
        let mut live: Vec<(usize, usize)> = batch.iter().enumerate().map(|(i, &(_, start, _))| (i, start)).collect();
        loop {
            let mut next = Vec::new();
            for (k, &(i, pos)) in live.iter().enumerate() {
                let (e, _, end) = batch[i];
                let token = argmax(&logits[k * vocab..(k + 1) * vocab]);
                if token != examples[e].ids[pos] {
                    continue;
                }
                if pos + 1 == end {
                    count.hits += 1;
                } else {
                    next.push((i, pos + 1));
                }
            }
            if next.is_empty() {
                break;
            }
            // The gold token is the one just decoded, so it is what goes in.
            let tokens: Vec<[u32; 1]> = next.iter().map(|&(i, pos)| [examples[batch[i].0].ids[pos - 1]]).collect();
            let token_refs: Vec<&[u32]> = tokens.iter().map(|t| t.as_slice()).collect();
            let mut refs: Vec<&mut SeqCache> = Vec::with_capacity(next.len());
            let mut wanted = next.iter().map(|&(i, _)| i).peekable();
            for (i, c) in caches.iter_mut().enumerate() {
                if wanted.peek() == Some(&i) {
                    wanted.next();
                    refs.push(c);
                }
            }
            logits = rt.forward_rows(&mut refs, &token_refs, &vec![Rows::Last; next.len()])?;
            live = next;
        }
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(ids: &[u32], mask: &[bool]) -> SftExample {
        SftExample { ids: ids.to_vec(), mask: mask.to_vec() }
    }

    #[test]
    fn spans_are_the_runs_of_trained_tokens_after_some_context() {
        let (t, f) = (true, false);
        let a = ex(&[1, 2, 3, 4, 5, 6, 7], &[f, t, t, f, f, t, f]);
        let b = ex(&[1, 2, 3], &[t, t, f]);
        assert_eq!(spans(&[a.clone(), b], 100), vec![(0, 1, 3), (0, 5, 6)]);
        // A span cut at `max_len` keeps its part within it.
        assert_eq!(spans(&[a], 2), vec![(0, 1, 2)]);
    }

    /// A random micro model and its greedy continuation of `prompt` by `n` tokens, decoded by
    /// the trainer's own forward pass (the whole sequence again for every token, no cache).
    fn model_and_greedy(prompt: &[u32], n: usize) -> (CausalLm, Vec<u32>) {
        let cfg = rl_model::micro_config(40);
        let tensors: std::collections::HashMap<_, _> = rl_model::random_weights(&cfg, 3).unwrap().into_iter().collect();
        let model =
            rl_model::Trainable::from_tensors(&cfg, &tensors).unwrap().model(&cfg, &candle_core::Device::Cpu).unwrap();
        let mut ids = prompt.to_vec();
        for _ in 0..n {
            let positions: Vec<u32> = (0..ids.len() as u32).collect();
            let logits = model.forward_packed(std::slice::from_ref(&ids), &[positions]).unwrap();
            let last: Vec<f32> = logits.squeeze(0).unwrap().get(ids.len() - 1).unwrap().to_vec1().unwrap();
            ids.push(argmax(&last));
        }
        let continuation = ids.split_off(prompt.len());
        (model, continuation)
    }

    #[test]
    fn counts_the_replies_decoded_token_for_token() {
        let prompt = [1, 7, 3, 9];
        let (model, greedy) = model_and_greedy(&prompt, 5);
        let (t, f) = (true, false);
        let reply = |tokens: &[u32]| {
            let ids: Vec<u32> = prompt.iter().chain(tokens).copied().collect();
            let mask: Vec<bool> = (0..ids.len()).map(|i| i >= prompt.len()).collect();
            ex(&ids, &mask)
        };
        let other = |t: u32| (t + 1) % 40;
        let mut wrong_last = greedy.clone();
        wrong_last[4] = other(wrong_last[4]);
        let mut wrong_first = greedy.clone();
        wrong_first[0] = other(wrong_first[0]);
        // Two turns: the first wrong, the second after the first's gold tokens and right, so
        // each span is judged from its own gold context.
        let (_, after_wrong) = model_and_greedy(&[1, 7, 3, 9, wrong_first[0], 5], 2);
        let two_turns = ex(&[1, 7, 3, 9, wrong_first[0], 5, after_wrong[0], after_wrong[1]], &[f, f, f, f, t, f, t, t]);
        let examples = [reply(&greedy), reply(&wrong_last), reply(&wrong_first), reply(&greedy[..2]), two_turns];
        assert_eq!(greedy_exact(&model, &examples).unwrap(), ExactCount { hits: 3, replies: 6 });
        // One at a time agrees with the batch.
        let alone: usize = examples.iter().map(|e| greedy_exact(&model, std::slice::from_ref(e)).unwrap().hits).sum();
        assert_eq!(alone, 3);
    }

    #[test]
    fn lag_is_smoothed_and_rate_is_plain() {
        let c = ExactCount { hits: 3, replies: 4 };
        assert!((c.lag() - 2.0 / 6.0).abs() < 1e-12 && (c.rate() - 0.75).abs() < 1e-12);
        assert!((ExactCount::default().lag() - 0.5).abs() < 1e-12);
        assert_eq!(ExactCount::default().rate(), 0.0);
    }
}
