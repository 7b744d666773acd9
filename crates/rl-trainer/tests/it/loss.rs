//! The loss equals the formula computed independently; its gradient matches finite differences;
//! trainer logprobs equal the sampler's.

use candle_core::{DType, Device, Tensor};
use rl_configs::LossConfig;
use rl_model::{KvCache, Sampler, Trainable, log_softmax};
use rl_trainer::{MicroBatch, micro_loss, step_counts, token_logprobs};

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
        rl_weights: vec![1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5],
        ce_weights: vec![0.0, 0.0, 0.0, 0.5, 0.0, 0.0, 0.3],
        ref_logprobs: vec![],
        env_index: vec![0; 7],
    }
}

/// Trainer logprobs computed here, independently of the loss code: log_softmax(logits[i-1] / T_i).
fn reference_lp(model: &rl_model::Qwen3, mb: &MicroBatch) -> Vec<f64> {
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
    let counts = step_counts(std::slice::from_ref(&mb));
    assert_eq!((counts.rl, counts.ce), (5, 2));
    let (loss, stats) = micro_loss(&model, &mb, &loss_cfg, counts).unwrap();

    let (mut rl, mut ce, mut low, mut high) = (0.0f64, 0.0f64, 0, 0);
    for (j, &lp_j) in lp.iter().enumerate() {
        let i = j + 1;
        let (a, w, cw) = (f64::from(mb.advantages[i]), f64::from(mb.rl_weights[i]), f64::from(mb.ce_weights[i]));
        let lmu = f64::from(lmu[i]);
        if mb.loss_mask[i] {
            let dp = lp_j.exp() - lmu.exp();
            let masked_high = a > 0.0 && dp > loss_cfg.mask_high;
            let masked_low = a <= 0.0 && dp < -loss_cfg.mask_low;
            high += usize::from(masked_high);
            low += usize::from(masked_low);
            let keep = if masked_high || masked_low { 0.0 } else { 1.0 };
            rl += w * (-(keep * a * (lp_j - lmu).exp()) + loss_cfg.kl_tau * (lp_j - lmu).powi(2));
        }
        ce += -lp_j * cw;
    }
    let want = rl / 5.0 + ce / 2.0;
    let got = loss.to_dtype(DType::F64).unwrap().to_scalar::<f64>().unwrap();
    assert!((got - want).abs() < 1e-5 * (1.0 + want.abs()), "loss {got} vs formula {want}");
    assert_eq!((stats.masked_high, stats.masked_low), (1, 1), "one token masked by each test");
    assert_eq!((high, low), (1, 1));

    // Temperature 2 halves the logits: the sample-2 logprobs equal log_softmax(z / 2).
    let (lp_t, _) = token_logprobs(&model, &mb).unwrap();
    let lp_t: Vec<f32> = lp_t.to_vec1().unwrap();
    for j in [4usize, 5] {
        assert!((f64::from(lp_t[j]) - lp[j]).abs() < 1e-5);
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
    let counts = step_counts(std::slice::from_ref(&mb));
    let loss_of = || micro_loss(&model, &mb, &loss_cfg, counts).unwrap().0;
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
    let mut cache = KvCache::default();
    let mut sampler = Sampler::new(temp, 1.0, None, 11);
    let mut logits: Vec<f32> = model.extend(&prompt, &mut cache).unwrap().to_vec2::<f32>().unwrap().pop().unwrap();
    let (mut ids, mut lps) = (prompt.clone(), vec![0.0f32; prompt.len()]);
    for _ in 0..16 {
        let (tok, lp) = sampler.sample(&logits);
        ids.push(tok);
        lps.push(lp);
        logits = model.decode_step(&[tok], &mut [&mut cache]).unwrap().squeeze(0).unwrap().to_vec1().unwrap();
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
        rl_weights: vec![],
        ce_weights: vec![],
        ref_logprobs: vec![],
        env_index: vec![0; n],
    };
    let (_, stats) = micro_loss(&model, &mb, &LossConfig::default(), step_counts(std::slice::from_ref(&mb))).unwrap();
    let kl = stats.mismatch_kl / stats.rl_tokens as f64;
    assert_eq!(stats.rl_tokens, 16);
    assert!(kl < 1e-6, "mismatch KL {kl}");
}
