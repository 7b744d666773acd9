//! The packed, cached and batched forwards compute the same function as a plain forward.

use std::sync::Arc;

use candle_core::{D, Tensor};
use rl_model::{CpuRuntime, RowLayout, Rows, Runtime, SeqCache, TensorRuntime};

use crate::{family_configs, max_abs_diff, micro_config, model, weights, wide_heads_config};

fn plain(model: &rl_model::CausalLm, ids: &[u32]) -> Tensor {
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
fn completions_sharing_a_prompt_equal_their_unshared_forwards() {
    for cfg in family_configs() {
        completions_sharing_a_prompt_equal_their_unshared_forwards_in(&cfg);
    }
}

fn completions_sharing_a_prompt_equal_their_unshared_forwards_in(cfg: &rl_model::ModelConfig) {
    let cfg = cfg.clone();
    let m = model(&cfg, 9);
    let (prompt, c1, c2) = (vec![3u32, 8, 1, 30], vec![5u32, 6, 7], vec![9u32, 2]);
    let layout = Arc::new(RowLayout::new(&[4, 3, 2], &[None, Some(0), Some(0)]).unwrap());
    let ids = [prompt.clone(), c1.clone(), c2.clone()].concat();
    let shared = m.logits(&m.hidden(&ids, &layout).unwrap()).unwrap();
    let full1 = plain(&m, &[prompt.clone(), c1].concat());
    let full2 = plain(&m, &[prompt, c2].concat());
    assert!(max_abs_diff(&shared.narrow(0, 0, 4).unwrap(), &full1.narrow(0, 0, 4).unwrap()) < 1e-5);
    assert!(max_abs_diff(&shared.narrow(0, 4, 3).unwrap(), &full1.narrow(0, 4, 3).unwrap()) < 1e-5);
    assert!(max_abs_diff(&shared.narrow(0, 7, 2).unwrap(), &full2.narrow(0, 4, 2).unwrap()) < 1e-5);
}

fn runtime_rows(logits: &[f32], vocab: usize) -> Vec<Tensor> {
    logits.chunks(vocab).map(|r| Tensor::new(r, &candle_core::Device::Cpu).unwrap()).collect()
}

#[test]
fn runtime_greedy_decoding_equals_the_training_forward() {
    for cfg in family_configs().into_iter().chain([wide_heads_config(2), wide_heads_config(3)]) {
        runtime_greedy_decoding_equals_the_training_forward_in(&cfg);
    }
}

fn runtime_greedy_decoding_equals_the_training_forward_in(cfg: &rl_model::ModelConfig) {
    let cfg = cfg.clone();
    let m = model(&cfg, 4);
    let rt = CpuRuntime::new(&m).unwrap();
    let v = cfg.vocab_size;
    let mut seq = vec![1u32, 7, 3, 30, 12, 5];
    let mut cache = rt.new_cache(None, 16);
    let prefill = rt.forward(&mut [&mut cache], &[&seq], true).unwrap();
    let full = plain(&m, &seq);
    for (i, row) in runtime_rows(&prefill, v).iter().enumerate() {
        assert!(max_abs_diff(row, &full.get(i).unwrap()) < 1e-4, "prompt row {i}");
    }
    let mut step_logits = vec![runtime_rows(&prefill, v).pop().unwrap()];
    for _ in 0..8 {
        let next = step_logits.last().unwrap().argmax(D::Minus1).unwrap().to_scalar::<u32>().unwrap();
        seq.push(next);
        let l = rt.forward(&mut [&mut cache], &[&[next]], false).unwrap();
        step_logits.push(runtime_rows(&l, v).pop().unwrap());
    }
    assert_eq!(cache.len(), seq.len());
    let full = plain(&m, &seq);
    for (k, logits) in step_logits.iter().enumerate() {
        let row = full.get(5 + k).unwrap();
        assert!(max_abs_diff(logits, &row) < 1e-4, "step {k}");
        assert_eq!(
            logits.argmax(0).unwrap().to_scalar::<u32>().unwrap(),
            row.argmax(0).unwrap().to_scalar::<u32>().unwrap()
        );
    }
}

#[test]
fn batched_shared_and_chunked_runtime_steps_agree() {
    for cfg in family_configs() {
        batched_shared_and_chunked_runtime_steps_agree_in(&cfg);
    }
}

fn batched_shared_and_chunked_runtime_steps_agree_in(cfg: &rl_model::ModelConfig) {
    let cfg = cfg.clone();
    let m = model(&cfg, 5);
    let rt = CpuRuntime::new(&m).unwrap();
    let v = cfg.vocab_size;
    let prompts = [vec![2u32, 9, 4], vec![11u32, 3, 3, 8, 19, 6, 1]];
    let mut caches: Vec<SeqCache> = prompts.iter().map(|_| rt.new_cache(None, 8)).collect();
    for (p, c) in prompts.iter().zip(caches.iter_mut()) {
        rt.forward(&mut [c], &[p], false).unwrap();
    }
    let mut singles = caches.clone();
    let tokens = [14u32, 27];
    let (c0, c1) = caches.split_at_mut(1);
    let batched = rt.forward(&mut [&mut c0[0], &mut c1[0]], &[&tokens[..1], &tokens[1..]], false).unwrap();
    for (i, (tok, cache)) in tokens.iter().zip(singles.iter_mut()).enumerate() {
        let single = rt.forward(&mut [cache], &[&[*tok]], false).unwrap();
        let diff = batched[i * v..(i + 1) * v].iter().zip(&single).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(diff < 1e-5, "sequence {i}: {diff}");
    }
    // A prompt prefilled once and shared by two sequences equals two unshared prefills.
    let prefix = {
        let mut c = rt.new_cache(None, 4);
        rt.forward(&mut [&mut c], &[&[4, 4, 9]], false).unwrap();
        c.into_shared()
    };
    let mut a = rt.new_cache(Some(&prefix), 4);
    let mut b = rt.new_cache(None, 8);
    let shared = rt.forward(&mut [&mut a], &[&[1, 2]], true).unwrap();
    let unshared = rt.forward(&mut [&mut b], &[&[4, 4, 9, 1, 2]], true).unwrap();
    let diff = shared.iter().zip(&unshared[3 * v..]).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    assert!(diff < 1e-5, "shared prefix: {diff}");
    assert_eq!(a.len(), 5);
}

/// Decode steps of the samples of two prompts (each prompt prefilled once and shared, the samples
/// at different lengths), batched with an unshared sequence: every sequence's logits equal those
/// of its own call and of a cache that holds the whole prompt itself (the shared prompt is
/// attended to by all its samples together).
#[test]
fn samples_of_a_shared_prompt_decode_together_as_alone() {
    for cfg in family_configs() {
        let m = model(&cfg, 7);
        let rt = CpuRuntime::new(&m).unwrap();
        let v = cfg.vocab_size;
        let prompts: [Vec<u32>; 2] = [(0..21).map(|i| 1 + (i * 7) % 29).collect(), vec![5, 8, 13, 2]];
        let mut caches = Vec::new();
        let mut plain = Vec::new();
        for (p, prompt) in prompts.iter().enumerate() {
            let mut c = rt.new_cache(None, prompt.len());
            rt.forward(&mut [&mut c], &[prompt], false).unwrap();
            let shared = c.into_shared();
            for s in 0..4 + p {
                // Samples already some tokens in, by different amounts.
                let own: Vec<u32> = (0..s as u32).map(|t| 3 + (t * 5 + s as u32) % 20).collect();
                let mut a = rt.new_cache(Some(&shared), 8);
                let mut b = rt.new_cache(None, 32);
                rt.forward(&mut [&mut b], &[&[prompt.clone(), own.clone()].concat()], false).unwrap();
                if !own.is_empty() {
                    rt.forward(&mut [&mut a], &[&own], false).unwrap();
                }
                caches.push(a);
                plain.push(b);
            }
        }
        caches.push(rt.new_cache(None, 8));
        let mut lone = rt.new_cache(None, 8);
        rt.forward(&mut [&mut lone], &[&[9u32, 4]], false).unwrap();
        rt.forward(&mut [caches.last_mut().unwrap()], &[&[9u32, 4]], false).unwrap();
        plain.push(lone);
        let mut alone = caches.clone();
        for step in 0..3u32 {
            let toks: Vec<[u32; 1]> = (0..caches.len() as u32).map(|i| [1 + (i * 3 + step) % 25]).collect();
            let toks: Vec<&[u32]> = toks.iter().map(|t| &t[..]).collect();
            let mut refs: Vec<&mut SeqCache> = caches.iter_mut().collect();
            let batched = rt.forward(&mut refs, &toks, false).unwrap();
            for (i, (a, b)) in alone.iter_mut().zip(plain.iter_mut()).enumerate() {
                let own = rt.forward(&mut [a], &[toks[i]], false).unwrap();
                let whole = rt.forward(&mut [b], &[toks[i]], false).unwrap();
                let row = &batched[i * v..(i + 1) * v];
                let diff = |x: &[f32]| row.iter().zip(x).map(|(p, q)| (p - q).abs()).fold(0f32, f32::max);
                assert!(
                    diff(&own) < 1e-5 && diff(&whole) < 1e-5,
                    "step {step} sequence {i}: {} / {}",
                    diff(&own),
                    diff(&whole)
                );
            }
        }
    }
}

/// A call over enough sequences is split between threads by sequence: its logits are
/// bit-identical to each sequence's own call (prompts of different lengths, last-row and all-row
/// choices, then a batched decode step).
#[test]
fn sequences_split_between_threads_give_the_logits_of_their_own_calls() {
    let cfg = micro_config();
    let m = model(&cfg, 8);
    let rt = CpuRuntime::new(&m).unwrap();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
    let prompts: Vec<Vec<u32>> =
        (0..27u32).map(|i| (0..1 + i % 7).map(|j| 1 + (i * 5 + j * 3) % 30).collect()).collect();
    let rows: Vec<Rows> = (0..prompts.len()).map(|i| if i % 3 == 0 { Rows::All } else { Rows::Last }).collect();
    let mut caches: Vec<SeqCache> = prompts.iter().map(|_| rt.new_cache(None, 16)).collect();
    let mut singles = caches.clone();
    let step = |caches: &mut Vec<SeqCache>, tokens: &[&[u32]], rows: &[Rows]| {
        let mut refs: Vec<&mut SeqCache> = caches.iter_mut().collect();
        pool.install(|| rt.forward_rows(&mut refs, tokens, rows)).unwrap()
    };
    let toks: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
    let mut batched = vec![step(&mut caches, &toks, &rows)];
    let next: Vec<[u32; 1]> = (0..prompts.len() as u32).map(|i| [2 + i % 20]).collect();
    let next_toks: Vec<&[u32]> = next.iter().map(|t| &t[..]).collect();
    batched.push(step(&mut caches, &next_toks, &vec![Rows::Last; prompts.len()]));
    let mut alone = vec![Vec::new(), Vec::new()];
    for (i, cache) in singles.iter_mut().enumerate() {
        alone[0].extend(rt.forward_rows(&mut [&mut *cache], &[toks[i]], &[rows[i]]).unwrap());
        alone[1].extend(rt.forward_rows(&mut [cache], &[next_toks[i]], &[Rows::Last]).unwrap());
    }
    assert_eq!(batched, alone);
}

#[test]
fn out_of_range_inputs_are_errors_not_panics() {
    let cfg = micro_config();
    let m = model(&cfg, 6);
    assert!(m.forward_packed(&[vec![999]], &[vec![0]]).is_err());
    assert!(m.forward_packed(&[vec![1, 2]], &[vec![0]]).is_err());
    let rt = CpuRuntime::new(&m).unwrap();
    let long: Vec<u32> = vec![1; 65];
    assert!(rt.forward(&mut [&mut rt.new_cache(None, 1)], &[&long], false).is_err());
    assert!(rt.forward(&mut [&mut rt.new_cache(None, 1)], &[&[999]], false).is_err());
    assert!(rt.forward(&mut [&mut rt.new_cache(None, 1)], &[&[]], false).is_err());
}

/// A prefill of two prompts (one continuing a shared prefix), then decode steps that outgrow the
/// caches' first capacity, through the `Runtime` trait: logits of every call.
fn scripted_run<R: Runtime>(rt: &R) -> Vec<Vec<f32>> {
    let mut out = Vec::new();
    let mut p = rt.new_cache(None, 2);
    out.push(rt.forward_rows(&mut [&mut p], &[&[4, 4, 9]], &[Rows::All]).unwrap());
    let prefix = rt.freeze(p).unwrap();
    assert_eq!(R::prefix_len(&prefix), 3);
    let (mut a, mut b) = (rt.new_cache(Some(&prefix), 1), rt.new_cache(None, 1));
    out.push(rt.forward_rows(&mut [&mut a, &mut b], &[&[1, 2], &[7, 3, 5, 8]], &[Rows::Last, Rows::All]).unwrap());
    for step in 0..6u32 {
        let toks = [10 + step, 20 + step];
        out.push(rt.forward_rows(&mut [&mut a, &mut b], &[&toks[..1], &toks[1..]], &[Rows::Last, Rows::Last]).unwrap());
    }
    assert_eq!((R::cache_len(&a), R::cache_len(&b)), (11, 10));
    // The first 7 tokens of `a` as a prefix continue exactly as `a` did.
    let first = rt.share_first(&a, 7).unwrap();
    let mut c = rt.new_cache(Some(&first), 4);
    out.push(rt.forward_rows(&mut [&mut c], &[&[12, 13]], &[Rows::All]).unwrap());
    out
}

#[test]
fn the_device_runtime_equals_the_cpu_runtime() {
    for cfg in family_configs() {
        the_device_runtime_equals_the_cpu_runtime_in(&cfg);
    }
}

fn the_device_runtime_equals_the_cpu_runtime_in(cfg: &rl_model::ModelConfig) {
    let cfg = cfg.clone();
    let m = model(&cfg, 6);
    let (cpu, dev) = (scripted_run(&CpuRuntime::new(&m).unwrap()), scripted_run(&TensorRuntime::new(&m).unwrap()));
    for (i, (a, b)) in cpu.iter().zip(&dev).enumerate() {
        assert_eq!(a.len(), b.len(), "call {i}");
        let diff = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        assert!(diff < 1e-4, "call {i}: {diff}");
    }
    // In bf16 (the GPU's dtype) it still tracks the f32 logits.
    let half = scripted_run(&TensorRuntime::new(&m.with_compute_dtype(candle_core::DType::BF16)).unwrap());
    let diff = cpu.iter().flatten().zip(half.iter().flatten()).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    assert!(diff < 0.1, "bf16 logits drift by {diff}");
}

/// Two prompts' logits (every row), then three decode steps' (the last rows).
fn two_prompts<R: Runtime>(rt: &R) -> Vec<f32> {
    let (mut a, mut b) = (rt.new_cache(None, 16), rt.new_cache(None, 16));
    let mut out = rt.forward_rows(&mut [&mut a, &mut b], &[&[3, 8, 1, 30], &[5, 6]], &[Rows::All, Rows::All]).unwrap();
    for step in 0..3u32 {
        let toks: [&[u32]; 2] = [&[7 + step], &[11 + step]];
        out.extend(rt.forward_rows(&mut [&mut a, &mut b], &toks, &[Rows::Last, Rows::Last]).unwrap());
    }
    out
}

#[test]
fn bf16_weights_compute_the_f32_runtime_of_the_rounded_model() {
    use candle_core::{DType, Device};
    for cfg in family_configs() {
        let w = weights(&cfg, 11, DType::F32);
        // Every matrix rounded to bf16; norms and biases (vectors) stay f32.
        let rounded: std::collections::HashMap<String, Tensor> = w
            .iter()
            .map(|(k, t)| {
                let t = if t.rank() == 2 {
                    t.to_dtype(DType::BF16).unwrap().to_dtype(DType::F32).unwrap()
                } else {
                    t.clone()
                };
                (k.clone(), t)
            })
            .collect();
        let build = |w: &std::collections::HashMap<String, Tensor>| {
            rl_model::Trainable::from_tensors(&cfg, w).unwrap().model(&cfg, &Device::Cpu).unwrap()
        };
        let (m, mr) = (build(&w), build(&rounded));
        let half = CpuRuntime::with_weight_dtype(&m, DType::BF16).unwrap();
        assert_eq!(half.weight_dtype(), DType::BF16);
        // The f32 runtime of the rounded model holds its matrices in bf16 as well (lossless), and
        // that of the unrounded model in f32: twice the bytes.
        let (f32_rounded, f32_full) = (CpuRuntime::new(&mr).unwrap(), CpuRuntime::new(&m).unwrap());
        assert_eq!(f32_rounded.weight_dtype(), DType::F32);
        assert_eq!(f32_rounded.packed_bytes(), half.packed_bytes());
        assert!(f32_full.packed_bytes() > half.packed_bytes() * 19 / 10, "f32 matrices take 4 bytes a value");
        let logits = [two_prompts(&half), two_prompts(&f32_rounded), two_prompts(&f32_full)];
        // The candle path computes the rounded model in f32 from its f32 tensors: an independent
        // check that packing it in bf16 is exact.
        let reference = two_prompts(&TensorRuntime::new(&mr).unwrap());
        let diff = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        let scale = logits[1].iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(diff(&logits[0], &logits[1]) <= 1e-6 * scale, "bf16 runtime != f32 runtime of the rounded weights");
        assert!(diff(&logits[1], &reference) < 1e-4, "the rounded model's packed runtime != its tensor runtime");
        assert!(diff(&logits[0], &logits[2]) > 1e-4 * scale, "rounding to bf16 changed nothing");
    }
}
