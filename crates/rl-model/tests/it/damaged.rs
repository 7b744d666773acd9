//! A damaged model directory (an interrupted download, a hand edit) is an error, never a panic:
//! weights truncated anywhere or overwritten in their header, and `config.json` or
//! `tokenizer.json` with bytes changed.

use std::path::Path;

use candle_core::Device;
use proptest::prelude::*;
use rl_model::{ChatTemplate, Preset, Tok, init_model, load_model, load_trainable, read_stored_weights};

/// Every loader a command runs on a model directory; Err is fine, a panic is not.
fn load_everything(dir: &Path) -> Result<(), TestCaseError> {
    let outcome = std::panic::catch_unwind(|| {
        let _ = load_model(dir, &Device::Cpu);
        let _ = load_trainable(dir, &Device::Cpu);
        let _ = read_stored_weights(dir, &Device::Cpu);
        let _ = Tok::load(dir);
        let _ = ChatTemplate::load(dir);
    });
    prop_assert!(outcome.is_ok(), "a loader panicked on {}", dir.display());
    Ok(())
}

/// A tiny model's directory.
fn model_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    init_model(dir.path(), Preset::Tiny, 0, true).unwrap();
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

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn overwritten_bytes_in_a_model_directory_are_an_error(
        file in prop::sample::select(vec!["model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"]),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let dir = model_dir();
        let path = dir.path().join(file);
        let mut bytes = std::fs::read(&path).unwrap();
        // In the weights, the header: changed tensor values are still a model.
        let span = if file == "model.safetensors" { header_end(&bytes) } else { bytes.len() };
        for (at, value) in edits {
            bytes[at.index(span)] = value;
        }
        std::fs::write(&path, &bytes).unwrap();
        load_everything(dir.path())?;
    }
}
