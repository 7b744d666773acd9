//! Packing: no token lost or duplicated, rows within `seq_len`, positions restart per sample.

use proptest::prelude::*;
use rl_orchestrator::{TrainingSample, pack};

fn sample(tag: u32, len: usize) -> TrainingSample {
    TrainingSample {
        ids: vec![tag; len],
        loss_mask: vec![true; len],
        advantages: vec![tag as f32; len],
        inference_logprobs: vec![-1.0; len],
        temperatures: vec![0.5; len],
        ce_weights: vec![0.0; len],
        env_index: tag % 3,
    }
}

proptest! {
    #[test]
    fn every_token_lands_exactly_once_within_seq_len(lens in prop::collection::vec(0usize..300, 0..40), seq_len in 1usize..256) {
        let samples: Vec<TrainingSample> = lens.iter().enumerate().map(|(k, &l)| sample(k as u32 + 1, l)).collect();
        let rows = pack(&samples, seq_len);
        let mut seen = vec![0usize; samples.len()];
        for row in &rows {
            let n = row.input_ids.len();
            prop_assert!(n <= seq_len && n > 0);
            prop_assert_eq!(row.seq_lens.iter().map(|&l| l as usize).sum::<usize>(), n);
            for arr_len in [row.position_ids.len(), row.loss_mask.len(), row.advantages.len(), row.inference_logprobs.len(), row.temperatures.len(), row.env_index.len()] {
                prop_assert_eq!(arr_len, n);
            }
            let mut start = 0;
            for &l in &row.seq_lens {
                let l = l as usize;
                let tag = row.input_ids[start];
                prop_assert!(row.input_ids[start..start + l].iter().all(|&t| t == tag), "a segment is one sample");
                prop_assert!(row.position_ids[start..start + l].iter().enumerate().all(|(i, &p)| p as usize == i));
                prop_assert!(row.advantages[start..start + l].iter().all(|&a| a == tag as f32), "fields travel with their tokens");
                seen[tag as usize - 1] += 1;
                prop_assert_eq!(l, lens[tag as usize - 1].min(seq_len));
                start += l;
            }
        }
        for (k, &l) in lens.iter().enumerate() {
            prop_assert_eq!(seen[k], usize::from(l > 0), "sample {} packed {} times", k, seen[k]);
        }
    }
}

/// A group member: the group's prompt (untrained) then a completion tagged with the sample.
fn member(prompt: &[u32], tag: u32, len: usize) -> TrainingSample {
    let n = prompt.len() + len;
    let ids: Vec<u32> = prompt.iter().copied().chain(std::iter::repeat_n(1000 + tag, len)).collect();
    TrainingSample {
        ids,
        loss_mask: (0..n).map(|i| i >= prompt.len()).collect(),
        advantages: (0..n).map(|i| if i >= prompt.len() { tag as f32 } else { 0.0 }).collect(),
        inference_logprobs: (0..n).map(|i| -(i as f32)).collect(),
        temperatures: vec![0.5; n],
        ce_weights: vec![0.0; n],
        env_index: tag % 3,
    }
}

/// One sample rebuilt from a row: token ids, advantages, positions.
type Rebuilt = (Vec<u32>, Vec<f32>, Vec<u32>);

/// Every token sequence of a row, rebuilt by following `parents` (root first).
fn sequences(row: &rl_proto::train::v1::MicroBatch) -> Vec<Rebuilt> {
    let mut starts = vec![0usize];
    for &l in &row.seq_lens {
        starts.push(starts.last().unwrap() + l as usize);
    }
    let parents: Vec<i32> = if row.parents.is_empty() { vec![-1; row.seq_lens.len()] } else { row.parents.clone() };
    let has_child: Vec<bool> = (0..parents.len()).map(|s| parents.contains(&(s as i32))).collect();
    let mut out = Vec::new();
    for (s, _) in has_child.iter().enumerate().filter(|(_, c)| !**c) {
        let mut chain = vec![s];
        while parents[*chain.last().unwrap()] >= 0 {
            chain.push(parents[*chain.last().unwrap()] as usize);
        }
        chain.reverse();
        let (mut ids, mut adv, mut pos) = (Vec::new(), Vec::new(), Vec::new());
        for c in chain {
            ids.extend_from_slice(&row.input_ids[starts[c]..starts[c + 1]]);
            adv.extend_from_slice(&row.advantages[starts[c]..starts[c + 1]]);
            pos.extend_from_slice(&row.position_ids[starts[c]..starts[c + 1]]);
        }
        out.push((ids, adv, pos));
    }
    out
}

proptest! {
    #[test]
    fn groups_share_their_prompt_and_every_sample_is_rebuilt_once(
        groups in prop::collection::vec((1usize..40, prop::collection::vec(1usize..60, 1..9)), 1..8),
        seq_len in 64usize..256,
    ) {
        let mut samples = Vec::new();
        let mut tag = 0u32;
        for (g, (plen, comps)) in groups.iter().enumerate() {
            let prompt: Vec<u32> = (0..*plen as u32).map(|i| 10 * g as u32 + i % 7).collect();
            for &c in comps {
                tag += 1;
                samples.push(member(&prompt, tag, c));
            }
        }
        let rows = pack(&samples, seq_len);
        let mut found = vec![0usize; samples.len()];
        let (mut packed, mut unshared) = (0usize, 0usize);
        for row in &rows {
            prop_assert!(row.input_ids.len() <= seq_len);
            packed += row.input_ids.len();
            for (ids, adv, pos) in sequences(row) {
                let t = (ids.last().copied().unwrap() - 1000) as usize;
                let s = &samples[t - 1];
                let n = s.ids.len().min(seq_len);
                prop_assert_eq!(&ids[..], &s.ids[..n], "sample {} rebuilt", t);
                prop_assert_eq!(&adv[..], &s.advantages[..n]);
                prop_assert!(pos.iter().enumerate().all(|(i, &p)| p as usize == i), "positions continue through the parent");
                found[t - 1] += 1;
            }
        }
        for s in &samples {
            unshared += s.ids.len().min(seq_len);
        }
        prop_assert!(found.iter().all(|&f| f == 1), "{:?}", found);
        let multi = groups.iter().any(|(p, c)| c.len() > 1 && *p + c.iter().take(2).map(|&x| x.min(seq_len - p)).sum::<usize>() <= seq_len);
        if multi {
            prop_assert!(packed < unshared, "a group's prompt is packed once: {} vs {}", packed, unshared);
        }
    }
}
