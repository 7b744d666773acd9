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
