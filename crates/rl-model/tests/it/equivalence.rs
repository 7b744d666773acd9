//! The packed, cached and batched forwards compute the same function as a plain forward.

use candle_core::{D, Tensor};
use rl_model::KvCache;

use crate::{max_abs_diff, micro_config, model};

fn plain(model: &rl_model::Qwen3, ids: &[u32]) -> Tensor {
    let pos: Vec<u32> = (0..ids.len() as u32).collect();
    model.forward_packed(&[ids.to_vec()], &[pos]).unwrap().squeeze(0).unwrap()
}

#[test]
fn packed_samples_equal_separate_forwards() {
    let cfg = micro_config();
    let m = model(&cfg, 3);
    let (a, b) = (vec![5u32, 9, 12, 7, 1], vec![33u32, 2, 8, 20]);
    let packed = m
        .forward_packed(&[[a.clone(), b.clone()].concat()], &[vec![0, 1, 2, 3, 4, 0, 1, 2, 3]])
        .unwrap()
        .squeeze(0)
        .unwrap();
    assert!(max_abs_diff(&packed.narrow(0, 0, 5).unwrap(), &plain(&m, &a)) < 1e-5);
    assert!(max_abs_diff(&packed.narrow(0, 5, 4).unwrap(), &plain(&m, &b)) < 1e-5);
}

#[test]
fn long_rows_attend_per_sample_and_still_equal_separate_forwards() {
    let mut cfg = micro_config();
    cfg.max_position_embeddings = 1024;
    let m = model(&cfg, 8);
    let a: Vec<u32> = (0..300).map(|i| (i * 7 % 37) + 1).collect();
    let b: Vec<u32> = (0..250).map(|i| (i * 5 % 31) + 2).collect();
    let pos: Vec<u32> = (0..300).chain(0..250).collect();
    let packed = m.forward_packed(&[[a.clone(), b.clone()].concat()], &[pos]).unwrap().squeeze(0).unwrap();
    assert!(max_abs_diff(&packed.narrow(0, 0, 300).unwrap(), &plain(&m, &a)) < 1e-4);
    assert!(max_abs_diff(&packed.narrow(0, 300, 250).unwrap(), &plain(&m, &b)) < 1e-4);
}

#[test]
fn cached_greedy_decoding_equals_full_recomputation() {
    let cfg = micro_config();
    let m = model(&cfg, 4);
    let mut seq = vec![1u32, 7, 3, 30, 12, 5];
    let mut cache = KvCache::default();
    let mut step_logits =
        vec![m.extend(&seq, &mut cache).unwrap().narrow(0, seq.len() - 1, 1).unwrap().squeeze(0).unwrap()];
    for _ in 0..8 {
        let next = step_logits.last().unwrap().argmax(D::Minus1).unwrap().to_scalar::<u32>().unwrap();
        seq.push(next);
        step_logits.push(m.decode_step(&[next], &mut [&mut cache]).unwrap().squeeze(0).unwrap());
    }
    assert_eq!(cache.len(), seq.len());
    let full = plain(&m, &seq);
    for (k, logits) in step_logits.iter().enumerate() {
        let row = full.narrow(0, 5 + k, 1).unwrap().squeeze(0).unwrap();
        assert!(max_abs_diff(logits, &row) < 1e-4, "step {k}");
    }
}

#[test]
fn batched_decode_steps_equal_single_sequence_steps() {
    let cfg = micro_config();
    let m = model(&cfg, 5);
    let prompts = [vec![2u32, 9, 4], vec![11u32, 3, 3, 8, 19, 6, 1]];
    let mut caches: Vec<KvCache> = prompts.iter().map(|_| KvCache::default()).collect();
    for (p, c) in prompts.iter().zip(caches.iter_mut()) {
        m.extend(p, c).unwrap();
    }
    let mut singles = caches.clone();
    let tokens = [14u32, 27];
    let (c0, c1) = caches.split_at_mut(1);
    let batched = m.decode_step(&tokens, &mut [&mut c0[0], &mut c1[0]]).unwrap();
    for (i, (tok, cache)) in tokens.iter().zip(singles.iter_mut()).enumerate() {
        let single = m.decode_step(&[*tok], &mut [cache]).unwrap();
        assert!(max_abs_diff(&batched.narrow(0, i, 1).unwrap(), &single) < 1e-5, "sequence {i}");
    }
    // Extending a cache by several tokens equals decoding them one by one.
    let mut a = KvCache::default();
    let ext = m.extend(&[4, 4, 9, 1, 2], &mut a).unwrap();
    let mut b = KvCache::default();
    m.extend(&[4, 4], &mut b).unwrap();
    let more = m.extend(&[9, 1, 2], &mut b).unwrap();
    assert!(max_abs_diff(&ext.narrow(0, 2, 3).unwrap(), &more) < 1e-5);
}

#[test]
fn out_of_range_inputs_are_errors_not_panics() {
    let cfg = micro_config();
    let m = model(&cfg, 6);
    assert!(m.forward_packed(&[vec![999]], &[vec![0]]).is_err());
    assert!(m.forward_packed(&[vec![1, 2]], &[vec![0]]).is_err());
    let long: Vec<u32> = vec![1; 65];
    assert!(m.extend(&long, &mut KvCache::default()).is_err());
    assert!(m.decode_step(&[1], &mut [&mut KvCache::default()]).is_err(), "decode needs a prefilled cache");
}
