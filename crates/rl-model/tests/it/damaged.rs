//! A damaged model or adapter directory (an interrupted download, a hand edit) is an error, never
//! a panic: weights truncated anywhere or overwritten in their header, and `config.json`,
//! `tokenizer.json` or `adapter_config.json` with bytes changed.

use std::path::Path;

use candle_core::Device;
use proptest::prelude::*;
use rl_configs::LoraConfig;
use rl_model::{
    ChatTemplate, Lora, Preset, Tok, init_adapters, init_model, load_model, load_trainable, read_adapter_dir,
    read_config, read_stored_weights, write_adapter_dir,
};

/// Every loader a command runs on a model directory; Err is fine, a panic is not.
fn load_everything(dir: &Path) -> Result<(), TestCaseError> {
    let outcome = std::panic::catch_unwind(|| {
        let _ = load_model(dir, &Device::Cpu);
        let _ = load_trainable(dir, &Device::Cpu);
        let _ = read_stored_weights(dir, &Device::Cpu);
        let _ = Tok::load(dir);
        let _ = ChatTemplate::load(dir);
        let adapter = dir.join("adapter");
        if let Ok(cfg) = read_config(dir) {
            let _ = read_adapter_dir(&cfg, &adapter, &Device::Cpu);
        }
    });
    prop_assert!(outcome.is_ok(), "a loader panicked on {}", dir.display());
    Ok(())
}

/// A tiny model's directory.
fn model_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let cfg = init_model(dir.path(), Preset::Tiny, 0, true).unwrap();
    let c = LoraConfig { rank: 4, alpha: 8.0, target_modules: vec![String::from("q_proj")], ..Default::default() };
    let lora = Lora::from_config(&c);
    let mut adapters: Vec<_> = init_adapters(&cfg, &lora, 0, &Device::Cpu).unwrap().into_iter().collect();
    adapters.sort_by(|a, b| a.0.cmp(&b.0));
    write_adapter_dir(&dir.path().join("adapter"), &lora, "base", &adapters).unwrap();
    // Undamaged, everything loads: the damage is what the tests add.
    read_adapter_dir(&cfg, &dir.path().join("adapter"), &Device::Cpu).unwrap();
    load_model(dir.path(), &Device::Cpu).unwrap();
    Tok::load(dir.path()).unwrap();
    dir
}

/// Where a safetensors file's JSON header ends (8-byte length, then the header).
fn header_end(bytes: &[u8]) -> usize {
    8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize
}

#[test]
fn truncated_weights_are_an_error() {
    let dir = model_dir();
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    // Every cut through the header and its first tensors, then every 4 KiB to the end.
    let cuts = (0..header_end(&bytes) + 256).chain((0..bytes.len()).step_by(4096)).chain([bytes.len() - 1]);
    for len in cuts {
        std::fs::write(&path, &bytes[..len]).unwrap();
        load_everything(dir.path()).unwrap();
        let err = load_model(dir.path(), &Device::Cpu).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("model.safetensors") || err.contains(&dir.path().display().to_string()), "{len}: {err}");
    }
}

/// `tokenizers` panics on some malformed sections (an `expect` in its decoder's reader): a key
/// that is not a string (found by the test below), or a decoder of neither known shape.
#[test]
fn malformed_tokenizer_sections_are_errors_naming_the_file() {
    let dir = model_dir();
    let path = dir.path().join("tokenizer.json");
    let good = std::fs::read_to_string(&path).unwrap();
    let v: serde_json::Value = serde_json::from_str(&good).unwrap();
    assert!(!v["decoder"].is_null(), "the tiny tokenizer has a decoder: {}", v["decoder"]);
    let at = good.find("\"decoder\"").unwrap();
    let open = at + good[at..].find('{').unwrap();
    let broken_key = format!("{}{{0{}", &good[..open], &good[open + 1..]);
    let mut odd_decoder = v;
    odd_decoder["decoder"] = serde_json::json!({"type": 5, "x": [1]});
    for text in [broken_key, odd_decoder.to_string()] {
        std::fs::write(&path, text).unwrap();
        let err = Tok::load(dir.path()).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("tokenizer.json"), "{err}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn overwritten_bytes_in_a_model_directory_are_an_error(
        file in prop::sample::select(vec![
            "model.safetensors",
            "config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "adapter/adapter_config.json",
            "adapter/adapter_model.safetensors",
        ]),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let dir = model_dir();
        let path = dir.path().join(file);
        let mut bytes = std::fs::read(&path).unwrap();
        // In the weights, the header: changed tensor values are still a model.
        let span = if file.ends_with(".safetensors") { header_end(&bytes) } else { bytes.len() };
        for (at, value) in edits {
            bytes[at.index(span)] = value;
        }
        std::fs::write(&path, &bytes).unwrap();
        load_everything(dir.path())?;
    }
}
