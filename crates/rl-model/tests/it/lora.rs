//! LoRA: fresh adapters leave the model unchanged; trained (random) adapters computed unmerged by
//! the training forward equal the merged weights in the generation runtime; every adapter gets a
//! gradient and no base weight is a variable; adapter directories round-trip and bad ones are named.

use candle_core::{D, DType, Device, Tensor};
use rl_configs::LoraConfig;
use rl_model::{CpuRuntime, Lora, Runtime, Trainable};

use crate::{family_configs, max_abs_diff, weights};

fn lora(modules: &[&str]) -> Lora {
    let c = LoraConfig {
        rank: 4,
        alpha: 8.0,
        target_modules: modules.iter().map(|m| (*m).to_owned()).collect(),
        ..Default::default()
    };
    Lora::from_config(&c)
}

/// Adapters with B as well as A random (a trained adapter), so they change the function; B from
/// `seed` too (uniform with std `0.05 + 0.001 i`), so every run tests the same adapters.
fn random_adapters(cfg: &rl_model::ModelConfig, l: &Lora, seed: u64) -> std::collections::HashMap<String, Tensor> {
    let mut a = rl_model::init_adapters(cfg, l, seed, &Device::Cpu).unwrap();
    let mut rng = rl_model::SplitMix64::new(seed ^ 0x5eed);
    // In name order: a map's own order changes from run to run.
    let mut entries: Vec<(&String, &mut Tensor)> = a.iter_mut().collect();
    entries.sort_by(|x, y| x.0.cmp(y.0));
    for (i, (name, t)) in entries.into_iter().enumerate() {
        if name.contains("lora_B") {
            let half_width = (0.05 + 0.001 * i as f64) * 3f64.sqrt();
            let values: Vec<f32> =
                (0..t.elem_count()).map(|_| ((rng.uniform() * 2.0 - 1.0) * half_width) as f32).collect();
            *t = Tensor::from_vec(values, t.dims(), &Device::Cpu).unwrap();
        }
    }
    a
}

fn logits(model: &rl_model::CausalLm, ids: &[u32]) -> Tensor {
    let pos: Vec<u32> = (0..ids.len() as u32).collect();
    model.forward_packed(&[ids.to_vec()], &[pos]).unwrap().squeeze(0).unwrap()
}

const IDS: [u32; 9] = [3, 17, 5, 30, 9, 22, 11, 2, 8];

#[test]
fn fresh_adapters_start_at_the_base_model_and_merged_adapters_equal_unmerged_ones() {
    for cfg in family_configs() {
        let base = weights(&cfg, 5, DType::F32);
        let plain = Trainable::from_tensors(&cfg, &base).unwrap().model(&cfg, &Device::Cpu).unwrap();
        for modules in [&rl_configs::LORA_MODULES[..], &["q_proj", "v_proj"], &["o_proj", "down_proj", "up_proj"]] {
            let l = lora(modules);
            let fresh = rl_model::init_adapters(&cfg, &l, 1, &Device::Cpu).unwrap();
            let t = Trainable::with_adapters(&cfg, base.clone(), &l, &fresh).unwrap();
            let m = t.model(&cfg, &Device::Cpu).unwrap();
            assert_eq!(
                max_abs_diff(&logits(&m, &IDS), &logits(&plain, &IDS)),
                0.0,
                "{modules:?}: B = 0 changed the model"
            );

            let trained = random_adapters(&cfg, &l, 2);
            let t = Trainable::with_adapters(&cfg, base.clone(), &l, &trained).unwrap();
            let unmerged = logits(&t.model(&cfg, &Device::Cpu).unwrap(), &IDS);
            assert!(max_abs_diff(&unmerged, &logits(&plain, &IDS)) > 1e-2, "{modules:?}: adapters changed nothing");
            let merged = rl_model::merge_adapters(&cfg, &l, &base, &trained).unwrap();
            let mm = Trainable::from_tensors(&cfg, &merged).unwrap().model(&cfg, &Device::Cpu).unwrap();
            assert!(max_abs_diff(&unmerged, &logits(&mm, &IDS)) < 1e-4, "{modules:?}: merged differs");
            // The generation runtime serves the merged weights with the trainer's logits.
            let rt = CpuRuntime::new(&mm).unwrap();
            let mut cache = rt.new_cache(None, 16);
            let out = rt.forward(&mut [&mut cache], &[&IDS], true).unwrap();
            let rt_logits = Tensor::from_vec(out, (IDS.len(), cfg.vocab_size), &Device::Cpu).unwrap();
            assert!(max_abs_diff(&unmerged, &rt_logits) < 1e-4, "{modules:?}: runtime differs");
            // The CPU runtime computes an adapted model's adapters unmerged, whether it gets them
            // with the model or as an adapter directory's tensors over the base weights; the
            // tensor runtime refuses them (it would ignore them).
            let adapted = t.model(&cfg, &Device::Cpu).unwrap();
            let base_rt = CpuRuntime::new(&plain).unwrap();
            let swapped = base_rt.with_adapters(&l, &trained).unwrap();
            for rt in [CpuRuntime::new(&adapted).unwrap(), swapped] {
                assert!(rt.has_adapters());
                assert_eq!(rt.packed_bytes(), base_rt.packed_bytes(), "the adapters are not packed into the base");
                let out = rt.forward(&mut [&mut rt.new_cache(None, 16)], &[&IDS], true).unwrap();
                let rt_logits = Tensor::from_vec(out, (IDS.len(), cfg.vocab_size), &Device::Cpu).unwrap();
                assert!(max_abs_diff(&unmerged, &rt_logits) < 1e-4, "{modules:?}: unmerged runtime differs");
            }
            let Err(err) = rl_model::TensorRuntime::new(&adapted) else { panic!("not refused") };
            let err = err.to_string();
            assert!(err.contains("merge"), "{err}");
            // Through the runtime contract: the tensor runtime merges the update into its base
            // weights, and refuses an update without them.
            let tensor = rl_model::TensorRuntime::new(&plain).unwrap();
            let dir = std::path::Path::new("adapter");
            let mut update = rl_model::AdapterUpdate { lora: l.clone(), adapters: trained.clone(), base: None };
            let Err(err) = tensor.with_adapter(dir, &update) else { panic!("merged without base weights") };
            assert!(err.to_string().contains("base weights"), "{err}");
            update.base = Some(std::sync::Arc::new(base.clone()));
            let merged_rt = tensor.with_adapter(dir, &update).unwrap();
            let mut cache = merged_rt.new_cache(None, 16);
            let out = merged_rt.forward_rows(&mut [&mut cache], &[&IDS], &[rl_model::Rows::All]).unwrap();
            let rt_logits = Tensor::from_vec(out, (IDS.len(), cfg.vocab_size), &Device::Cpu).unwrap();
            assert!(max_abs_diff(&unmerged, &rt_logits) < 1e-4, "{modules:?}: tensor runtime's merge differs");
        }
    }
}

#[test]
fn every_adapter_gets_a_gradient_and_no_base_weight_is_trained() {
    for cfg in family_configs() {
        let l = lora(&rl_configs::LORA_MODULES);
        let t =
            Trainable::with_adapters(&cfg, weights(&cfg, 6, DType::F32), &l, &random_adapters(&cfg, &l, 3)).unwrap();
        assert_eq!(t.vars.len(), cfg.num_hidden_layers, "one flat adapter variable per layer");
        assert!(t.parts().iter().all(|p| p.name.contains(".lora_")), "only adapters are trained");
        let m = t.model(&cfg, &Device::Cpu).unwrap();
        let logp = candle_nn::ops::log_softmax(&logits(&m, &IDS), D::Minus1).unwrap();
        let loss = logp.narrow(1, 7, 1).unwrap().sum_all().unwrap().neg().unwrap();
        let grads = loss.backward().unwrap();
        for part in t.parts() {
            let g = grads.get(t.vars[part.var].1.as_tensor()).expect("adapter gradient");
            let g = t.part_of(part, g).unwrap();
            let norm = g.sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap();
            assert!(norm > 0.0, "{}: zero gradient", part.name);
        }
    }
}

#[test]
fn adapter_directories_round_trip_and_bad_ones_are_named() {
    let cfg = family_configs().remove(0);
    let l = lora(&["q_proj", "gate_proj"]);
    let adapters = random_adapters(&cfg, &l, 4);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("adapter");
    let mut list: Vec<(String, Tensor)> = adapters.clone().into_iter().collect();
    list.sort_by(|a, b| a.0.cmp(&b.0));
    rl_model::write_adapter_dir(&out, &l, "base-model", &list).unwrap();
    assert!(rl_model::is_adapter_dir(&out));
    let (back, tensors) = rl_model::read_adapter_dir(&cfg, &out, &Device::Cpu).unwrap();
    assert_eq!(back, l);
    for (name, t) in &adapters {
        assert_eq!(max_abs_diff(t, &tensors[name]), 0.0, "{name}");
    }
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join(rl_model::ADAPTER_CONFIG)).unwrap()).unwrap();
    assert_eq!(config["peft_type"], "LORA");
    assert_eq!(config["target_modules"], serde_json::json!(["q_proj", "gate_proj"]));
    // A rank that does not match the tensors, and rsLoRA, are refused naming the directory.
    let edit = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut c = config.clone();
        f(&mut c);
        std::fs::write(out.join(rl_model::ADAPTER_CONFIG), c.to_string()).unwrap();
        rl_model::read_adapter_dir(&cfg, &out, &Device::Cpu).unwrap_err().to_string()
    };
    let e = edit(&|c| c["r"] = serde_json::json!(8));
    assert!(e.contains("adapter") && e.contains("expected") && e.contains(&out.display().to_string()), "{e}");
    let e = edit(&|c| c["use_rslora"] = serde_json::json!(true));
    assert!(e.contains("use_rslora"), "{e}");
    let e = edit(&|c| c["target_modules"] = serde_json::json!(["lm_head"]));
    assert!(e.contains("lm_head"), "{e}");
}
