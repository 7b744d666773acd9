//! Hub ids as transformers and vLLM take them (`Qwen/Qwen3-0.6B`): a model in the local Hugging
//! Face hub cache is found by its id and served under it, and an adapter naming its base by id
//! merges onto the cached base. Nothing is downloaded; a missing id keeps its error.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::{rl, stderr};

/// `rl` with `HF_HUB_CACHE` set to `cache`.
fn rl_with_cache(cache: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rl"))
        .args(args)
        .current_dir(crate::root())
        .env("HF_HUB_CACHE", cache)
        .output()
        .expect("run rl")
}

/// A hub cache holding `org/tiny` (an `rl model init` model) at commit `c1`; its snapshot.
fn cache_with_model(cache: &Path) -> PathBuf {
    let repo = cache.join("models--org--tiny");
    let snapshot = repo.join("snapshots/c1");
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), "c1").unwrap();
    let o = rl(&["model", "init", "--out", snapshot.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    snapshot
}

#[test]
fn a_model_hub_id_is_read_from_the_hub_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("hub");
    let snapshot = cache_with_model(&cache);
    let out = tmp.path().join("out");

    // Resolved at load time, so a dry run shows it: the snapshot, served under the id.
    let o = rl_with_cache(
        &cache,
        &["inference", "--model.path", "org/tiny", "--output-dir", out.to_str().unwrap(), "--dry-run"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("note: model `org/tiny` is the hub cache's"), "{}", stderr(&o));
    let resolved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("configs/inference.json")).unwrap()).unwrap();
    assert_eq!(resolved["model"]["path"].as_str(), snapshot.to_str());
    assert_eq!(resolved["model"]["name"], "org/tiny");

    // A whole command on it.
    let sft = ["sft", "--model.path", "org/tiny", "--output-dir", out.to_str().unwrap(), "--max-steps", "1", "--clean"];
    let o = rl_with_cache(&cache, &[&sft[..], &["--batch-size", "2", "--seq-len", "128"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));

    // An adapter whose base_model_name_or_path is the id (as PEFT writes it) merges onto the cache's base.
    let cfg = rl_model::read_config(&snapshot).unwrap();
    let lora = rl_model::Lora::from_config(&rl_configs::LoraConfig { rank: 2, ..Default::default() });
    let adapters = rl_model::init_adapters(&cfg, &lora, 1, &candle_core::Device::Cpu).unwrap();
    let adapter = tmp.path().join("adapter");
    std::fs::create_dir_all(&adapter).unwrap();
    rl_model::write_adapter_files(&adapter, &lora, "org/tiny", &adapters.into_iter().collect::<Vec<_>>()).unwrap();
    let merged = tmp.path().join("merged");
    let merge =
        ["model", "merge", "--adapter", adapter.to_str().unwrap(), "--out", merged.to_str().unwrap(), "--force"];
    let o = rl_with_cache(&cache, &merge);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(merged.join("config.json").is_file());

    // Without the model in the cache, the id is not a model directory, as before, and says so.
    let empty = tmp.path().join("empty-hub");
    let o = rl_with_cache(&empty, &merge);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("nor in the Hugging Face hub cache"), "{}", stderr(&o));
    let o = rl_with_cache(&empty, &sft);
    assert!(!o.status.success() && stderr(&o).contains("org/tiny"), "{}", stderr(&o));
}
