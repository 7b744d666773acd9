//! The loss equals the formula computed independently; its gradient matches finite differences;
//! trainer logprobs equal the sampler's.

use candle_core::{DType, Device, Tensor};
use rl_configs::LossConfig;
use rl_model::{CpuRuntime, Sampler, Trainable, log_softmax};
use rl_trainer::{MicroBatch, Pass, SftExample, micro_loss, pack, step_counts, token_logprobs};

use crate::{micro_config, weights};

/// Two packed samples; the second sampled at temperature 2.
fn batch(lmu: Vec<f32>) -> MicroBatch {
    MicroBatch {
        input_ids: vec![3, 10, 11, 12, 5, 20, 21],
        position_ids: vec![0, 1, 2, 3, 0, 1, 2],
        seq_lens: vec![4, 3],
        loss_mask: vec![false, true, true, true, false, true, true],
        advantages: vec![0.0, 1.0, 1.0, -0.5, 0.0, -1.0, 0.8],
        inference_logprobs: lmu,
        temperatures: vec![1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0],
        ce_weights: vec![0.0, 0.0, 0.0, 0.5, 0.0, 0.0, 0.3],
        env_index: vec![0; 7],
        parents: vec![],
    }
}

/// Trainer logprobs computed here, independently of the loss code: log_softmax(logits[i-1] / T_i).
fn reference_lp(model: &rl_model::CausalLm, mb: &MicroBatch) -> Vec<f64> {
    let logits: Vec<Vec<f32>> = model
        .forward_packed(std::slice::from_ref(&mb.input_ids), std::slice::from_ref(&mb.position_ids))
        .unwrap()
        .squeeze(0)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec2()
        .unwrap();
    (1..mb.input_ids.len())
        .map(|i| f64::from(log_softmax(&logits[i - 1], mb.temperatures[i])[mb.input_ids[i] as usize]))
        .collect()
}

#[test]
fn the_loss_equals_the_formula_for_masked_and_kept_tokens_and_mixed_temperatures() {
    let cfg = micro_config();
    let t = Trainable::from_tensors(&cfg, &weights(&cfg, 1, DType::F32)).unwrap();
    let model = t.model(&cfg, &Device::Cpu).unwrap();
    let lp = reference_lp(&model, &batch(vec![0.0; 7]));
    // lmu per target token (indices 1..7): keep, masked-high, masked-low, (not rl), keep, keep.
    let lmu_t = [lp[0] + 0.01, (1e-6f64).ln(), 0.9f64.ln(), 0.0, lp[4] - 0.02, lp[5]];
    let mut lmu = vec![0.0f32];
    lmu.extend(lmu_t.iter().map(|&x| x as f32));
    let mb = batch(lmu.clone());
    let loss_cfg = LossConfig { mask_low: 0.2, mask_high: 0.001, kl_tau: 1e-3, adv_tau: 1.0 };
    let counts = step_counts(std::slice::from_ref(&mb)).unwrap();
    assert_eq!((counts.rl, counts.ce), (5, 2));
    let (loss, stats) = micro_loss(&model, &mb, &loss_cfg, counts, Pass::Eval).unwrap();

    let (mut rl, mut ce, mut low, mut high) = (0.0f64, 0.0f64, 0, 0);
    for (j, &lp_j) in lp.iter().enumerate() {
        let i = j + 1;
        let (a, cw) = (f64::from(mb.advantages[i]), f64::from(mb.ce_weights[i]));
        let lmu = f64::from(lmu[i]);
        if mb.loss_mask[i] {
            let dp = lp_j.exp() - lmu.exp();
            let masked_high = a > 0.0 && dp > loss_cfg.mask_high;
            let masked_low = a <= 0.0 && dp < -loss_cfg.mask_low;
            high += usize::from(masked_high);
            low += usize::from(masked_low);
            let keep = if masked_high || masked_low { 0.0 } else { 1.0 };
            rl += -(keep * a * (lp_j - lmu).exp()) + loss_cfg.kl_tau * (lp_j - lmu).powi(2);
        }
        ce += -lp_j * cw;
    }
    let want = rl / 5.0 + ce / 2.0;
    let got = loss.to_dtype(DType::F64).unwrap().to_scalar::<f64>().unwrap();
    assert!((got - want).abs() < 1e-5 * (1.0 + want.abs()), "loss {got} vs formula {want}");
    assert_eq!((stats.masked_high, stats.masked_low), (1, 1), "one token masked by each test");
    assert_eq!((high, low), (1, 1));

    // Temperature 2 halves the logits: the sample-2 logprobs equal log_softmax(z / 2).
    let scored = token_logprobs(&model, &mb).unwrap();
    assert_eq!(scored.tokens, vec![1, 2, 3, 5, 6], "loss-mask and ce tokens are scored, sample starts never");
    let lp_t: Vec<f32> = scored.lp.to_vec1().unwrap();
    for (k, &i) in scored.tokens.iter().enumerate() {
        assert!((f64::from(lp_t[k]) - lp[i - 1]).abs() < 1e-5, "token {i}");
    }
    let hot = reference_lp(&model, &MicroBatch { temperatures: vec![1.0; 7], ..mb });
    assert!((hot[4] - lp[4]).abs() > 1e-3, "the temperature changes the logprob");
}

#[test]
fn the_gradient_of_the_full_loss_matches_finite_differences() {
    let cfg = micro_config();
    let t = Trainable::from_tensors(&cfg, &weights(&cfg, 2, DType::F64)).unwrap();
    let model = t.model(&cfg, &Device::Cpu).unwrap();
    let lp = reference_lp(&model, &batch(vec![0.0; 7]));
    let mut lmu = vec![0.0f32];
    lmu.extend([lp[0] + 0.05, lp[1] - 0.05, 0.9f64.ln(), 0.0, lp[4] - 0.02, lp[5] + 0.03].iter().map(|&x| x as f32));
    let mb = batch(lmu);
    let loss_cfg = LossConfig { kl_tau: 0.1, ..LossConfig::default() };
    let counts = step_counts(std::slice::from_ref(&mb)).unwrap();
    let loss_of = || micro_loss(&model, &mb, &loss_cfg, counts, Pass::Eval).unwrap().0;
    let grads = loss_of().backward().unwrap();
    let eps = 1e-6;
    for (name, var) in t.vars.iter().step_by(3) {
        let analytic: Vec<f64> = grads.get(var.as_tensor()).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let base: Vec<f64> = var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        let shape = var.as_tensor().shape().clone();
        let idx = analytic.iter().enumerate().max_by(|a, b| a.1.abs().total_cmp(&b.1.abs())).unwrap().0;
        let eval = |d: f64| {
            let mut v = base.clone();
            v[idx] += d;
            var.set(&Tensor::from_vec(v, shape.clone(), &Device::Cpu).unwrap()).unwrap();
            loss_of().to_scalar::<f64>().unwrap()
        };
        let numeric = (eval(eps) - eval(-eps)) / (2.0 * eps);
        var.set(&Tensor::from_vec(base, shape.clone(), &Device::Cpu).unwrap()).unwrap();
        assert!(
            (numeric - analytic[idx]).abs() <= 1e-6 + 1e-4 * analytic[idx].abs(),
            "{name}: {} vs {numeric}",
            analytic[idx]
        );
    }
}

#[test]
fn trainer_logprobs_equal_the_generation_logprobs() {
    let cfg = micro_config();
    let t = Trainable::from_tensors(&cfg, &weights(&cfg, 3, DType::F32)).unwrap();
    let model = t.model(&cfg, &Device::Cpu).unwrap();
    let prompt = vec![1u32, 9, 14, 22, 5];
    let temp = 0.8;
    let rt = CpuRuntime::new(&model).unwrap();
    let mut cache = rt.new_cache(None, 32);
    let mut sampler = Sampler::new(rl_configs::Temperature::new(f64::from(temp)).unwrap(), 1.0, None, 11);
    let mut logits: Vec<f32> = rt.forward(&mut [&mut cache], &[&prompt], false).unwrap();
    let (mut ids, mut lps) = (prompt.clone(), vec![0.0f32; prompt.len()]);
    for _ in 0..16 {
        let (tok, lp) = sampler.sample(&logits);
        ids.push(tok);
        lps.push(lp);
        logits = rt.forward(&mut [&mut cache], &[&[tok]], false).unwrap();
    }
    let n = ids.len();
    let mb = MicroBatch {
        input_ids: ids,
        position_ids: (0..n as u32).collect(),
        seq_lens: vec![n as u32],
        loss_mask: (0..n).map(|i| i >= prompt.len()).collect(),
        advantages: vec![1.0; n],
        inference_logprobs: lps,
        temperatures: vec![temp; n],
        ce_weights: vec![],
        env_index: vec![0; n],
        parents: vec![],
    };
    let (_, stats) =
        micro_loss(&model, &mb, &LossConfig::default(), step_counts(std::slice::from_ref(&mb)).unwrap(), Pass::Eval)
            .unwrap();
    let kl = stats.mismatch_kl / stats.rl_tokens as f64;
    assert_eq!(stats.rl_tokens, 16);
    assert!(kl < 1e-6, "mismatch KL {kl}");
}

/// A group of three completions of one prompt, packed unshared (prompt + completion per sample)
/// and shared (the prompt once, each completion with the prompt as parent).
fn group(shared: bool) -> MicroBatch {
    let prompt = [2u32, 7, 9, 4, 13];
    let comps: [&[u32]; 3] = [&[5, 6, 8], &[11, 3], &[30, 31, 32, 33]];
    let advs = [1.0f32, -0.5, 0.25];
    let temps = [1.0f32, 0.7, 1.3];
    let mut mb = MicroBatch::default();
    // Appends tokens, as a new sample or (`join`) as more of the last one.
    let push = |mb: &mut MicroBatch, ids: &[u32], pos0: u32, join: bool, train: bool, adv: f32, temp: f32| {
        mb.input_ids.extend_from_slice(ids);
        mb.position_ids.extend((0..ids.len() as u32).map(|p| p + pos0));
        match mb.seq_lens.last_mut() {
            Some(last) if join => *last += ids.len() as u32,
            _ => mb.seq_lens.push(ids.len() as u32),
        }
        mb.loss_mask.extend(std::iter::repeat_n(train, ids.len()));
        mb.advantages.extend(std::iter::repeat_n(if train { adv } else { 0.0 }, ids.len()));
        mb.inference_logprobs.extend((0..ids.len()).map(|k| if train { -1.5 - 0.1 * k as f32 } else { 0.0 }));
        mb.temperatures.extend(std::iter::repeat_n(temp, ids.len()));
        mb.env_index.extend(std::iter::repeat_n(0, ids.len()));
    };
    if shared {
        push(&mut mb, &prompt, 0, false, false, 0.0, 1.0);
        for ((c, a), t) in comps.iter().zip(advs).zip(temps) {
            push(&mut mb, c, prompt.len() as u32, false, true, a, t);
        }
        mb.parents = vec![-1, 0, 0, 0];
    } else {
        for ((c, a), t) in comps.iter().zip(advs).zip(temps) {
            push(&mut mb, &prompt, 0, false, false, 0.0, t);
            push(&mut mb, c, prompt.len() as u32, true, true, a, t);
        }
    }
    mb
}

#[test]
fn a_shared_prompt_gives_the_same_logprobs_loss_and_gradients_as_unshared_packing() {
    let cfg = micro_config();
    let t = Trainable::from_tensors(&cfg, &weights(&cfg, 4, DType::F64)).unwrap();
    let model = t.model(&cfg, &Device::Cpu).unwrap();
    let (shared, unshared) = (group(true), group(false));
    assert!(shared.input_ids.len() < unshared.input_ids.len());
    let (ls, lu) = (token_logprobs(&model, &shared).unwrap(), token_logprobs(&model, &unshared).unwrap());
    let (vs, vu): (Vec<f64>, Vec<f64>) = (ls.lp.to_vec1().unwrap(), lu.lp.to_vec1().unwrap());
    assert_eq!(vs.len(), 9, "every completion token is scored, the first predicted by the prompt's last");
    assert_eq!(vs.len(), vu.len());
    for (a, b) in vs.iter().zip(&vu) {
        assert!((a - b).abs() <= 1e-5 * b.abs().max(1e-3), "{a} vs {b}");
    }
    let cfg_loss = LossConfig { kl_tau: 0.1, ..LossConfig::default() };
    let run = |mb: &MicroBatch| {
        let counts = step_counts(std::slice::from_ref(mb)).unwrap();
        let (loss, stats) = micro_loss(&model, mb, &cfg_loss, counts, Pass::Eval).unwrap();
        (loss.to_scalar::<f64>().unwrap(), stats, loss.backward().unwrap())
    };
    let ((l1, s1, g1), (l2, s2, g2)) = (run(&shared), run(&unshared));
    assert!((l1 - l2).abs() <= 1e-5 * l2.abs(), "loss {l1} vs {l2}");
    assert_eq!((s1.rl_tokens, s1.entropy_tokens), (s2.rl_tokens, s2.entropy_tokens));
    for (name, var) in &t.vars {
        let (a, b) = (g1.get(var.as_tensor()).unwrap(), g2.get(var.as_tensor()).unwrap());
        let diff = (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f64>().unwrap();
        let scale = b.abs().unwrap().max_all().unwrap().to_scalar::<f64>().unwrap();
        assert!(diff <= 1e-5 * scale.max(1e-12), "{name}: gradients differ by {diff} (scale {scale})");
    }
}

/// SFT conversations that open with the same prompt: packed together (the prompt once, each
/// conversation continuing it) they train the same tokens with the same loss and gradients as
/// each packed on its own.
#[test]
fn sft_rows_sharing_a_prompt_train_as_conversations_packed_whole() {
    let cfg = micro_config();
    let t = Trainable::from_tensors(&cfg, &weights(&cfg, 5, DType::F64)).unwrap();
    let model = t.model(&cfg, &Device::Cpu).unwrap();
    let prompt = [2u32, 7, 9, 4, 13, 1];
    let tails: [&[(u32, bool)]; 3] = [
        &[(5, false), (6, true), (8, true)],
        &[(11, true), (3, true), (3, false), (20, true)],
        &[(30, false), (31, false), (32, true)],
    ];
    let exs: Vec<SftExample> = tails
        .iter()
        .map(|tail| SftExample {
            ids: prompt.iter().copied().chain(tail.iter().map(|(id, _)| *id)).collect(),
            mask: std::iter::repeat_n(false, prompt.len()).chain(tail.iter().map(|(_, m)| *m)).collect(),
        })
        .collect();
    let shared = pack(&exs, 64);
    let whole: Vec<MicroBatch> = exs.iter().flat_map(|ex| pack(std::slice::from_ref(ex), 64)).collect();
    assert_eq!(shared.len(), 1);
    assert_eq!(shared[0].input_ids.len(), prompt.len() + 3 + 4 + 3, "the prompt is carried once");
    let run = |rows: &[MicroBatch]| {
        let counts = step_counts(rows).unwrap();
        let mut total: Option<Tensor> = None;
        for r in rows {
            let (loss, _) = micro_loss(&model, r, &LossConfig::default(), counts, Pass::Eval).unwrap();
            total = Some(match total {
                Some(t) => (t + loss).unwrap(),
                None => loss,
            });
        }
        let total = total.unwrap();
        (counts.ce, total.to_scalar::<f64>().unwrap(), total.backward().unwrap())
    };
    let ((n1, l1, g1), (n2, l2, g2)) = (run(&shared), run(&whole));
    assert_eq!(n1, 6);
    assert_eq!(n1, n2);
    assert!((l1 - l2).abs() <= 1e-5 * l2.abs(), "loss {l1} vs {l2}");
    for (name, var) in &t.vars {
        let (a, b) = (g1.get(var.as_tensor()).unwrap(), g2.get(var.as_tensor()).unwrap());
        let diff = (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f64>().unwrap();
        let scale = b.abs().unwrap().max_all().unwrap().to_scalar::<f64>().unwrap();
        assert!(diff <= 1e-5 * scale.max(1e-12), "{name}: gradients differ by {diff} (scale {scale})");
    }
}
