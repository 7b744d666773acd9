//! `--dry-run` on every shipped config, the deprecated-key compat configs, and error exits.

use std::path::Path;

use crate::{rl, root, stderr, stdout};

/// The `rl` command a shipped config is for, from its file name.
fn command_for(path: &Path) -> &'static str {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if name.starts_with("sft") { "sft" } else { "rl" }
}

fn tomls(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read configs/").flatten() {
        let path = entry.path();
        if path.is_dir() {
            tomls(&path, out);
        } else if path.extension().is_some_and(|e| e == "toml") {
            out.push(path);
        }
    }
}

#[test]
fn every_shipped_config_dry_runs() {
    let mut files = Vec::new();
    tomls(&root().join("configs"), &mut files);
    assert!(files.len() >= 5, "configs/ should hold the shipped recipes, found {files:?}");
    let out = tempfile::tempdir().unwrap();
    for file in &files {
        let rel = file.strip_prefix(root()).unwrap().display().to_string();
        // A variant that opens by saying it is layered on its directory's rl.toml runs on top of it.
        let first = std::fs::read_to_string(file).unwrap().lines().next().unwrap_or("").to_owned();
        let base = file.with_file_name("rl.toml").strip_prefix(root()).unwrap().display().to_string();
        let mut args = vec![command_for(file)];
        if first.contains("layered on rl.toml") {
            args.extend(["@", &base]);
        }
        args.extend(["@", &rel, "--dry-run", "--output-dir", out.path().to_str().unwrap()]);
        let o = rl(&args);
        assert!(o.status.success(), "{rel} failed to dry-run:\n{}", stderr(&o));
        assert!(stdout(&o).contains("config is valid"), "{rel}: {}", stdout(&o));
        // Our own configs are read as written: prime-rl's spellings are noted only in its shape.
        if !rel.contains("prime_rl") {
            assert!(!stderr(&o).contains("(prime-rl's spelling)"), "{rel} read as prime-rl's:\n{}", stderr(&o));
        }
    }
}

#[test]
fn compat_config_translates_each_deprecated_key_with_one_warning() {
    let out = tempfile::tempdir().unwrap();
    let o = rl(&[
        "rl",
        "@",
        "configs/compat/reverse_text_rl.toml",
        "--dry-run",
        "--output-dir",
        out.path().to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let warnings: Vec<String> = stderr(&o).lines().filter(|l| l.starts_with("warning:")).map(String::from).collect();
    for (old, new) in [
        ("orchestrator.sampling`", "orchestrator.train.sampling`"),
        ("orchestrator.env`", "orchestrator.train.env`"),
        ("orchestrator.sampling.max_tokens`", "max_completion_tokens`"),
        ("orchestrator.rollouts_per_example`", "orchestrator.group_size`"),
    ] {
        let n = warnings.iter().filter(|w| w.contains(old) && w.contains(new)).count();
        assert_eq!(n, 1, "expected one warning for {old} -> {new}, got {warnings:#?}");
    }
    assert_eq!(warnings.len(), 4, "{warnings:#?}");
    let json = out.path().join("reverse-text-rl-compat/configs/rl.json");
    let resolved: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(resolved["orchestrator"]["train"]["sampling"]["max_completion_tokens"], 32);
    assert_eq!(resolved["orchestrator"]["train"]["env"][0]["group_size"], 8);
    let orch = out.path().join("reverse-text-rl-compat/configs/orchestrator.json");
    assert!(orch.exists(), "the orchestrator's own config is written too");
    assert!(out.path().join("reverse-text-rl-compat/configs/envs/train/reverse-text.json").exists());
}

#[test]
fn a_prime_rl_config_runs_as_prime_rls_launcher_runs_it_with_a_note_per_translation() {
    let out = tempfile::tempdir().unwrap();
    // `rl @ file.toml`, as prime-rl's launcher is called, is `rl rl @ file.toml`.
    let config = "configs/verifiers/prime_rl_sources.toml";
    let o = rl(&["@", config, "--dry-run", "--output-dir", out.path().to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    let notes: Vec<&str> = err.lines().filter(|l| l.starts_with("note:")).collect();
    for key in ["monitors.file", "orchestrator.algo", "orchestrator.train.source", "orchestrator.eval.source"] {
        assert_eq!(notes.iter().filter(|n| n.contains(&format!("`{key}`"))).count(), 1, "{key}: {notes:#?}");
    }
    let json = out.path().join("verifiers-prime-rl-sources/configs/orchestrator.json");
    let resolved: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(resolved["train"]["env"][0]["id"], "verifiers");
    assert_eq!(resolved["eval"]["env"][0]["name"], "reverse-held-out");
    assert!(out.path().join("verifiers-prime-rl-sources/configs/envs/eval/reverse-held-out.json").exists());
}

#[test]
fn unknown_key_exits_non_zero_naming_its_path() {
    let o = rl(&[
        "rl",
        "@",
        "configs/reverse_text/rl.toml",
        "--orchestrator.train.sampling.temprature",
        "0.5",
        "--dry-run",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains("orchestrator.train.sampling.temprature") && err.contains("did you mean `temperature`"),
        "{err}"
    );
}

#[test]
fn eval_without_eval_envs_and_unknown_commands_fail_loudly() {
    let o = rl(&["eval"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("nothing to evaluate"), "{}", stderr(&o));
    // `--dry-run` fails where the run would, without writing resolved configs.
    let o = rl(&["eval", "--dry-run"]);
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    assert!(stderr(&o).contains("nothing to evaluate"), "{}", stderr(&o));
    let o = rl(&["frobnicate"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("unknown command"), "{}", stderr(&o));
    let o = rl(&["--version"]);
    assert!(o.status.success() && stdout(&o).starts_with("rl "), "{}", stdout(&o));
    // An OS error is said once, not once by the error and again by its cause.
    let o = rl(&["sft", "@", "/nonexistent/sft.toml"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stderr(&o).matches("os error 2").count(), 1, "{}", stderr(&o));
}

#[test]
fn schema_prints_json_schema_for_each_part() {
    for part in ["rl", "sft", "orchestrator", "trainer", "inference", "env-server"] {
        let o = rl(&["schema", part]);
        assert!(o.status.success(), "{part}: {}", stderr(&o));
        let schema: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        assert!(schema.get("properties").is_some(), "{part} schema has properties");
    }
    assert!(!rl(&["schema", "nope"]).status.success());
}

#[test]
fn model_init_writes_a_loadable_directory_and_refuses_to_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tiny");
    let out_s = out.to_str().unwrap();
    let o = rl(&["model", "init", "--out", out_s, "--preset", "tiny", "--seed", "3"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("params"), "{}", stdout(&o));
    assert!(out.join("model.safetensors").exists() && out.join("tokenizer_config.json").exists());
    let again = rl(&["model", "init", "--out", out_s]);
    assert!(!again.status.success() && stderr(&again).contains("--force"), "{}", stderr(&again));
    let bad = rl(&["model", "init", "--out", out_s, "--preset", "huge"]);
    assert!(stderr(&bad).contains("unknown preset"), "{}", stderr(&bad));
    // Stored in bf16, as released checkpoints are: half the bytes, the same model read back.
    let f32_bytes = std::fs::metadata(out.join("model.safetensors")).unwrap().len();
    let o = rl(&["model", "init", "--out", out_s, "--seed", "3", "--dtype", "bf16", "--force"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let stored = rl_model::read_stored_weights(&out, &candle_core::Device::Cpu).unwrap();
    assert!(stored.values().all(|t| t.dtype() == candle_core::DType::BF16));
    assert!(std::fs::metadata(out.join("model.safetensors")).unwrap().len() < f32_bytes * 6 / 10);
    let config = std::fs::read_to_string(out.join("config.json")).unwrap();
    assert!(config.contains("\"torch_dtype\": \"bfloat16\""), "{config}");
    let bad = rl(&["model", "init", "--out", out_s, "--dtype", "fp8", "--force"]);
    assert!(stderr(&bad).contains("unknown dtype `fp8`"), "{}", stderr(&bad));
}

#[test]
fn model_init_changes_the_presets_shape_and_checks_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("shaped");
    let out_s = out.to_str().unwrap();
    let shape = ["--num-layers", "2", "--num-heads", "8", "--num-kv-heads", "4", "--head-dim", "16"];
    let o = rl(&[&["model", "init", "--out", out_s][..], &shape].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("2 layers, 8/4 heads of 16"), "{}", stdout(&o));
    let cfg = rl_model::ModelConfig::load(&out.join("config.json")).unwrap();
    let got = (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim);
    assert_eq!(got, (128, 2, 8, 4, 16), "the tiny preset's hidden size, the rest as given");
    assert_eq!(cfg.extra["max_window_layers"], 2);
    let weights = rl_model::read_stored_weights(&out, &candle_core::Device::Cpu).unwrap();
    assert_eq!(weights["model.layers.1.self_attn.q_proj.weight"].dims(), [8 * 16, 128]);
    assert!(!weights.contains_key("model.layers.2.self_attn.q_proj.weight"));
    rl_model::load_model(&out, &candle_core::Device::Cpu).unwrap();
    for (args, expected) in [
        (&["--num-heads", "3"][..], "num_attention_heads (3) must be a multiple of num_key_value_heads (2)"),
        (&["--head-dim", "15"][..], "head_dim (15) must be even"),
        (&["--num-layers", "0"][..], "--num-layers expects a positive integer, got `0`"),
        (&["--hidden-size", "x"][..], "--hidden-size expects a positive integer, got `x`"),
    ] {
        let o = rl(&[&["model", "init", "--out", out_s, "--force"][..], args].concat());
        assert!(!o.status.success() && stderr(&o).contains(expected), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn model_init_draws_the_weights_at_the_given_std_and_records_it() {
    let dir = tempfile::tempdir().unwrap();
    let std_of = |out: &std::path::Path| {
        let weights = rl_model::read_stored_weights(out, &candle_core::Device::Cpu).unwrap();
        let w = weights["model.layers.0.mlp.up_proj.weight"].flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let n = w.len() as f64;
        let mean = w.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        (w.iter().map(|&x| (f64::from(x) - mean).powi(2)).sum::<f64>() / n).sqrt()
    };
    let (plain, wide) = (dir.path().join("plain"), dir.path().join("wide"));
    for (out, extra) in [(&plain, &[][..]), (&wide, &["--init-std", "0.05"][..])] {
        let o = rl(&[&["model", "init", "--out", out.to_str().unwrap()][..], extra].concat());
        assert!(o.status.success(), "{}", stderr(&o));
    }
    // 49,152 draws: the sample std is within 1% of the drawn one.
    let (a, b) = (std_of(&plain), std_of(&wide));
    assert!((a - 0.02).abs() < 2e-4 && (b - 0.05).abs() < 5e-4, "std {a} / {b}");
    let cfg = rl_model::ModelConfig::load(&wide.join("config.json")).unwrap();
    assert_eq!(cfg.extra["initializer_range"], 0.05, "config.json says how the weights were drawn");
    let norm = rl_model::read_stored_weights(&wide, &candle_core::Device::Cpu).unwrap();
    let ones = norm["model.norm.weight"].flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert!(ones.iter().all(|&x| x == 1.0), "norms stay ones");
    for bad in ["0", "-0.1", "1.5", "nan", "x"] {
        let o = rl(&["model", "init", "--out", wide.to_str().unwrap(), "--force", "--init-std", bad]);
        assert!(
            !o.status.success() && stderr(&o).contains("--init-std expects a number in (0, 1]"),
            "{bad}: {}",
            stderr(&o)
        );
    }
}

#[test]
fn model_init_trains_a_bpe_on_a_corpus_and_checks_its_flags() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.txt");
    std::fs::write(&corpus, "AdaLovelace met AlanTuring\n".repeat(50)).unwrap();
    let out = dir.path().join("bpe");
    let (out_s, corpus_s) = (out.to_str().unwrap(), corpus.to_str().unwrap());
    let o = rl(&["model", "init", "--out", out_s, "--tokenizer-corpus", corpus_s, "--vocab-size", "150"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let tok = rl_model::Tok::load(&out).unwrap();
    assert!(tok.vocab_size() <= 150, "{}", tok.vocab_size());
    assert_eq!(tok.encode("AdaLovelace met").unwrap().len(), 4, "Ada, Lovelace, space, met");
    let padded = tok.vocab_size().div_ceil(64) * 64;
    assert!(stdout(&o).contains(&format!("vocab {padded}")), "the embedding is padded to 64: {}", stdout(&o));
    assert!(!stdout(&o).contains("filled"), "every repeated pair merged within 150: {}", stdout(&o));
    // JSONL conversations, as `rl sft` reads them: the contents are the corpus.
    let jsonl = dir.path().join("corpus.jsonl");
    let row = r#"{"messages": [{"role": "user", "content": "GraceHopper?"}, {"role": "assistant", "content": "GraceHopper"}]}"#;
    std::fs::write(&jsonl, format!("{row}\n").repeat(40)).unwrap();
    let o = rl(&["model", "init", "--out", out_s, "--force", "--tokenizer-corpus", jsonl.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(rl_model::Tok::load(&out).unwrap().encode("GraceHopper").unwrap().len(), 2);
    let o = rl(&["model", "init", "--out", out_s, "--force", "--tokenizer-task", "alphabet-sort"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("vocab 512"), "{}", stdout(&o));
    // Phrases repeat more than 512 entries hold: init says so (the names would stay split).
    let o = rl(&[
        "model",
        "init",
        "--out",
        out_s,
        "--force",
        "--tokenizer-task",
        "alphabet-sort",
        "--bpe-pieces",
        "phrases",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("filled all 512 entries"), "{}", stdout(&o));
    let o =
        rl(&["model", "init", "--out", out_s, "--force", "--tokenizer-corpus", corpus_s, "--bpe-pieces", "attached"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(rl_model::Tok::load(&out).unwrap().encode("AdaLovelace met").unwrap().len(), 3, "Ada, Lovelace, ` met`");
    for (args, expected) in [
        (vec!["--vocab-size", "300"], "give `--tokenizer-task` or `--tokenizer-corpus`"),
        (vec!["--bpe-pieces", "attached"], "give `--tokenizer-task` or `--tokenizer-corpus`"),
        (vec!["--tokenizer-corpus", corpus_s, "--bpe-pieces", "glued"], "--bpe-pieces: unknown kind `glued`"),
        (vec!["--tokenizer-task", "alphabet-sort", "--tokenizer-corpus", corpus_s], "not both"),
        (vec!["--tokenizer-task", "chess"], "no SFT generator"),
        (vec!["--tokenizer-corpus", "/nonexistent.txt"], "/nonexistent.txt"),
        (vec!["--tokenizer-corpus", corpus_s, "--vocab-size", "20"], "at least"),
    ] {
        let mut all = vec!["model", "init", "--out", out_s, "--force"];
        all.extend(args);
        let o = rl(&all);
        assert!(!o.status.success() && stderr(&o).contains(expected), "{all:?}: {}", stderr(&o));
    }
}
