//! SFT rows: tokenized conversations packed into rows of at most `seq_len` tokens. Conversations
//! that open with the same prompt tokens (a system prompt, tool signatures) carry that prompt once
//! a row: it is the row's first segment and every conversation continues it as its parent (the
//! layout RL uses for a group's shared prompt), so a row trains the same tokens with the same loss
//! and gradients while the forward and backward passes skip the repeated prompt.

use crate::MicroBatch;

/// One tokenized conversation: ids and, per token, whether it is a training target.
#[derive(Debug, Clone, PartialEq)]
pub struct SftExample {
    /// Token ids.
    pub ids: Vec<u32>,
    /// True on trained tokens.
    pub mask: Vec<bool>,
}

/// How examples fit rows of `seq_len` tokens: longer ones are truncated, and those whose trained
/// tokens all lie beyond `seq_len` would train nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fit {
    /// Examples longer than `seq_len`.
    pub truncated: usize,
    /// Examples with no trained token within their first `seq_len` tokens.
    pub untrainable: usize,
    /// The longest example, in tokens.
    pub longest: usize,
}

/// Counts what [`pack`] will truncate, and the examples left with nothing to train.
pub fn fit(examples: &[SftExample], seq_len: usize) -> Fit {
    let mut f = Fit::default();
    for ex in examples {
        f.longest = f.longest.max(ex.ids.len());
        f.truncated += usize::from(ex.ids.len() > seq_len);
        // `pack` never trains position 0 (nothing predicts it).
        let kept = &ex.mask[..ex.mask.len().min(seq_len)];
        f.untrainable += usize::from(!kept.iter().skip(1).any(|m| *m));
    }
    f
}

/// The tokens of `ex` that a row holds (at most `seq_len`; fewer than two train nothing).
pub(crate) fn kept(ex: &SftExample, seq_len: usize) -> usize {
    ex.ids.len().min(seq_len)
}

/// Tokens before the first trained one (position 0 is never trained: nothing predicts it).
fn context(ex: &SftExample, n: usize) -> usize {
    ex.mask[..n].iter().skip(1).position(|m| *m).map_or(n, |i| i + 1)
}

/// The prompt tokens every packed example opens with: their longest common prefix, cut to lie
/// within every example's untrained context and to leave every example at least one token of
/// its own. 0 when fewer than two examples are packed (nothing to share).
pub fn shared_prompt(examples: &[SftExample], seq_len: usize) -> usize {
    let mut packed = examples.iter().filter(|ex| kept(ex, seq_len) >= 2);
    let (Some(first), Some(_)) = (packed.next(), packed.next()) else { return 0 };
    examples.iter().filter(|ex| kept(ex, seq_len) >= 2).fold(usize::MAX, |p, ex| {
        let n = kept(ex, seq_len);
        let common = first.ids.iter().zip(&ex.ids).take_while(|(a, b)| a == b).count();
        p.min(common).min(context(ex, n)).min(n - 1)
    })
}

/// Packs examples in order into rows of at most `seq_len` tokens (longer examples are truncated).
/// With a shared prompt ([`shared_prompt`]) each row opens with it once and holds each example's
/// remaining tokens as a segment continuing it; otherwise examples are packed whole.
pub fn pack(examples: &[SftExample], seq_len: usize) -> Vec<MicroBatch> {
    let prompt = shared_prompt(examples, seq_len);
    let mut rows: Vec<MicroBatch> = Vec::new();
    let mut cur = MicroBatch::default();
    for ex in examples {
        let n = kept(ex, seq_len);
        if n < 2 {
            continue;
        }
        if cur.input_ids.len() + n - prompt > seq_len && cur.seq_lens.len() > usize::from(prompt > 0) {
            rows.push(std::mem::take(&mut cur));
        }
        if prompt > 0 && cur.input_ids.is_empty() {
            push(&mut cur, ex, 0..prompt, -1);
        }
        push(&mut cur, ex, prompt..n, if prompt > 0 { 0 } else { -1 });
    }
    if cur.seq_lens.len() > usize::from(prompt > 0) {
        rows.push(cur);
    }
    for r in &mut rows {
        let n = r.input_ids.len();
        r.loss_mask = vec![false; n];
        r.advantages = vec![0.0; n];
        r.inference_logprobs = vec![0.0; n];
        r.temperatures = vec![1.0; n];
        r.env_index = vec![0; n];
        if prompt == 0 {
            r.parents.clear();
        }
    }
    rows
}

/// Appends `ex`'s tokens `range` as a segment of the row (`parent`: its index, or -1).
fn push(row: &mut MicroBatch, ex: &SftExample, range: std::ops::Range<usize>, parent: i32) {
    row.input_ids.extend_from_slice(&ex.ids[range.clone()]);
    row.position_ids.extend(range.start as u32..range.end as u32);
    row.seq_lens.push(range.len() as u32);
    // A shared prompt lies within every example's untrained context: its weights are all 0.
    row.ce_weights.extend(range.map(|i| if ex.mask[i] && i > 0 { 1.0 } else { 0.0 }));
    row.parents.push(parent);
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Examples opening with the same prompt, each with its own tokens and trained mask.
    fn examples() -> impl Strategy<Value = (Vec<SftExample>, usize)> {
        (
            prop::collection::vec(0u32..6, 0..12),
            prop::collection::vec(prop::collection::vec((0u32..6, any::<bool>()), 0..14), 1..7),
            4usize..40,
        )
            .prop_map(|(prompt, tails, seq_len)| {
                let exs = tails
                    .into_iter()
                    .map(|tail| {
                        let mut ex = SftExample { ids: prompt.clone(), mask: vec![false; prompt.len()] };
                        for (id, train) in tail {
                            ex.ids.push(id);
                            ex.mask.push(train);
                        }
                        ex
                    })
                    .collect();
                (exs, seq_len)
            })
    }

    /// Every example rebuilt from the rows: its sequence (ancestors' tokens, then its own) with
    /// positions and the weight of each token.
    fn rebuilt(rows: &[MicroBatch]) -> Vec<(Vec<u32>, Vec<u32>, Vec<f32>)> {
        let mut out = Vec::new();
        for r in rows {
            let mut start = 0;
            let mut segs: Vec<std::ops::Range<usize>> = Vec::new();
            for &len in &r.seq_lens {
                segs.push(start..start + len as usize);
                start += len as usize;
            }
            for s in 0..segs.len() {
                let parent = r.parents.get(s).copied().unwrap_or(-1);
                if !r.parents.is_empty() && parent < 0 {
                    continue; // the shared prompt, rebuilt into each example below
                }
                let mut idx: Vec<usize> =
                    if parent >= 0 { segs[parent as usize].clone().collect() } else { Vec::new() };
                idx.extend(segs[s].clone());
                let w = idx.iter().map(|&i| r.ce_weights[i]).collect();
                out.push((
                    idx.iter().map(|&i| r.input_ids[i]).collect(),
                    idx.iter().map(|&i| r.position_ids[i]).collect(),
                    w,
                ));
            }
        }
        out
    }

    proptest! {
        #[test]
        fn rows_hold_every_example_once_with_its_positions_and_weights((exs, seq_len) in examples()) {
            let rows = pack(&exs, seq_len);
            let prompt = shared_prompt(&exs, seq_len);
            let mut want = Vec::new();
            for ex in &exs {
                let n = ex.ids.len().min(seq_len);
                if n < 2 {
                    continue;
                }
                let w = (0..n).map(|i| if ex.mask[i] && i > 0 { 1.0 } else { 0.0 }).collect();
                want.push((ex.ids[..n].to_vec(), (0..n as u32).collect::<Vec<_>>(), w));
            }
            prop_assert_eq!(rebuilt(&rows), want);
            for r in &rows {
                prop_assert!(r.input_ids.len() <= seq_len);
                prop_assert_eq!(r.input_ids.len(), r.ce_weights.len());
                prop_assert_eq!(r.seq_lens.iter().sum::<u32>() as usize, r.input_ids.len());
                if prompt > 0 {
                    prop_assert_eq!(r.parents[0], -1);
                    prop_assert_eq!(r.seq_lens[0] as usize, prompt);
                    prop_assert!(r.ce_weights[..prompt].iter().all(|w| *w == 0.0), "the prompt never trains");
                }
            }
            // A trained token's weight comes from its example, never from a shared prompt.
            let trained: f32 = rows.iter().flat_map(|r| &r.ce_weights).sum();
            let expected: usize = exs.iter().map(|ex| {
                let n = ex.ids.len().min(seq_len);
                if n < 2 { 0 } else { ex.mask[1..n].iter().filter(|m| **m).count() }
            }).sum();
            prop_assert_eq!(trained as usize, expected);
        }
    }

    #[test]
    fn a_common_system_prompt_is_carried_once_a_row() {
        let ex = |tail: &[u32]| {
            let ids: Vec<u32> = [1, 2, 3, 4].iter().chain(tail).copied().collect();
            let mask = (0..ids.len()).map(|i| i >= 5).collect();
            SftExample { ids, mask }
        };
        let exs = [ex(&[7, 8, 9]), ex(&[7, 5, 6, 2]), ex(&[9, 9])];
        // The common prefix is [1, 2, 3, 4] plus 7 for two of them: only the first four are shared.
        assert_eq!(shared_prompt(&exs, 64), 4);
        let rows = pack(&exs, 64);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].seq_lens, [4, 3, 4, 2]);
        assert_eq!(rows[0].parents, [-1, 0, 0, 0]);
        assert_eq!(rows[0].position_ids, [0, 1, 2, 3, 4, 5, 6, 4, 5, 6, 7, 4, 5]);
        // A row too short for all three: each row opens with the prompt again.
        let rows = pack(&exs, 8);
        assert_eq!(rows.iter().map(|r| r.seq_lens.clone()).collect::<Vec<_>>(), [vec![4, 3], vec![4, 4], vec![4, 2]]);
        // One example alone: nothing to share, packed whole.
        assert_eq!(shared_prompt(&exs[..1], 64), 0);
        assert!(pack(&exs[..1], 64)[0].parents.is_empty());
    }
}
