//! `rl sft` on reverse-text, small enough for CI: validation loss falls and the greedy task reward
//! of the fine-tuned model rises above the random model's.

use std::path::Path;

use candle_core::Device;
use rl_model::{ChatTemplate, CpuRuntime, Sampler, TemplateMessage, Tok, load_model};

use crate::{rl, stderr};

/// Mean reverse-text reward of greedy replies to the test split's prompts.
fn greedy_reward(model_dir: &Path, prompts: &[(String, String)]) -> f64 {
    let model = load_model(model_dir, &Device::Cpu).unwrap();
    let tok = Tok::load(model_dir).unwrap();
    let template = ChatTemplate::load(model_dir).unwrap();
    let mut total = 0.0;
    for (text, answer) in prompts {
        let msgs = [
            TemplateMessage {
                role: "system".into(),
                content: rl_envs::REVERSE_TEXT_SYSTEM_PROMPT.into(),
                tool_calls: vec![],
                reasoning_content: None,
            },
            TemplateMessage { role: "user".into(), content: text.clone(), tool_calls: vec![], reasoning_content: None },
        ];
        let ids = tok.encode(&template.render(&msgs, &[], true).unwrap()).unwrap();
        let rt = CpuRuntime::new(&model).unwrap();
        let mut cache = rt.new_cache(None, ids.len() + 48);
        let mut logits: Vec<f32> = rt.forward(&mut [&mut cache], &[&ids], false).unwrap();
        let mut sampler = Sampler::new(rl_configs::Temperature::GREEDY, 1.0, None, 0);
        let mut out = Vec::new();
        for _ in 0..48 {
            let (t, _) = sampler.sample(&logits);
            if tok.stop_ids.contains(&t) {
                break;
            }
            out.push(t);
            logits = rt.forward(&mut [&mut cache], &[&[t]], false).unwrap();
        }
        total += rl_envs::lcs_reward(&tok.decode(&out).unwrap(), answer);
    }
    total / prompts.len() as f64
}

#[test]
fn sft_lowers_validation_loss_and_raises_greedy_reward() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("tiny");
    assert!(rl(&["model", "init", "--out", base.to_str().unwrap(), "--seed", "1"]).status.success());
    let out = tmp.path().to_str().unwrap();
    let o = rl(&[
        "sft",
        "@",
        "configs/reverse_text/sft.toml",
        "--output-dir",
        out,
        "--model.path",
        base.to_str().unwrap(),
        "--max-steps",
        "40",
        "--batch-size",
        "16",
        "--val.interval",
        "10",
        "--val.num-examples",
        "16",
        "--scheduler",
        r#"{"type": "cosine", "warmup_steps": 5, "min_lr": 1e-4}"#,
        "--optim.lr",
        "0.003",
        "--data.args",
        r#"{"min_len": 3, "max_len": 6}"#,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let run = tmp.path().join("reverse-text-sft");
    let vals: Vec<f64> = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["val_loss"].as_f64())
        .collect();
    assert_eq!(vals.len(), 4);
    assert!(vals[3] < vals[0] * 0.8, "validation loss falls: {vals:?}");

    let args = serde_json::json!({"num_examples": 1, "test_examples": 12, "min_len": 3, "max_len": 6, "seed": 0});
    let env = rl_envs::ReverseText::new(args.as_object().unwrap()).unwrap();
    let prompts: Vec<(String, String)> = env
        .sft_conversations("test")
        .into_iter()
        .map(|c| {
            let text = c[1].content.clone();
            (text.clone(), text.chars().rev().collect())
        })
        .collect();
    let before = greedy_reward(&base, &prompts);
    let after = greedy_reward(&run.join("model"), &prompts);
    assert!(after > before + 0.05, "greedy reward before {before:.3}, after {after:.3}");
    let again =
        rl(&["sft", "@", "configs/reverse_text/sft.toml", "--output-dir", out, "--model.path", base.to_str().unwrap()]);
    assert!(!again.status.success() && stderr(&again).contains("--clean"), "a fresh run refuses a non-empty run dir");
}

/// Examples whose trained part lies beyond `seq_len` are counted and dropped with a warning; a
/// dataset with nothing trainable within `seq_len` fails instead of training nothing.
#[test]
fn examples_beyond_seq_len_are_reported_and_none_fitting_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("tiny");
    assert!(rl(&["model", "init", "--out", base.to_str().unwrap()]).status.success());
    let data = tmp.path().join("data.jsonl");
    let long = r#"{"prompt": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "completion": "b"}"#;
    let run_sft = |lines: &[&str]| {
        std::fs::write(&data, lines.join("\n")).unwrap();
        rl(&[
            "sft",
            "--output-dir",
            tmp.path().to_str().unwrap(),
            "--model.path",
            base.to_str().unwrap(),
            "--data",
            &format!(r#"{{"type": "jsonl", "path": {:?}}}"#, data.to_str().unwrap()),
            "--seq-len",
            "64",
            "--max-steps",
            "1",
            "--batch-size",
            "2",
        ])
    };
    let o = run_sft(&[long, long]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("none of the 2 training examples") && stderr(&o).contains("seq_len"), "{}", stderr(&o));
    let o = run_sft(&[long, r#"{"prompt": "hi", "completion": "yo"}"#]);
    assert!(o.status.success(), "{}", stderr(&o));
    let all = format!("{}{}", crate::stdout(&o), stderr(&o));
    assert!(all.contains("1 of 2 training examples are longer than seq_len"), "{all}");
    assert!(all.contains("(1 truncated to seq_len, 1 dropped)"), "{all}");
}

/// `rl sft` with `[tensorboard]` writes its losses as event scalars and its resolved config next to
/// its output; a W&B sidecar that fails is reported, and the fine-tuning still finishes.
#[test]
fn sft_tracking_writes_tensorboard_events_and_survives_a_failing_sidecar() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("tiny");
    assert!(rl(&["model", "init", "--out", base.to_str().unwrap()]).status.success());
    let o = rl(&[
        "sft",
        "@",
        "configs/reverse_text/sft.toml",
        "--output-dir",
        tmp.path().to_str().unwrap(),
        "--model.path",
        base.to_str().unwrap(),
        "--max-steps",
        "3",
        "--scheduler",
        r#"{"type": "constant"}"#,
        "--tensorboard",
        "{}",
        "--wandb",
        r#"{"project": "p", "mode": "offline", "python": ["false"]}"#,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("W&B sidecar failed"), "{}", stderr(&o));
    let run = tmp.path().join("reverse-text-sft");
    assert!(run.join("configs/sft.json").exists());
    let events: Vec<_> = std::fs::read_dir(run.join("tensorboard")).unwrap().flatten().collect();
    let bytes = std::fs::read(events[0].path()).unwrap();
    assert!(String::from_utf8_lossy(&bytes).contains("grad_norm"), "loss scalars are in the event file");
}

/// `val.stop_below`: training stops at the first validation at or below it, and the model of that
/// step is written.
#[test]
fn sft_stops_once_the_validation_loss_reaches_stop_below() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("tiny");
    assert!(rl(&["model", "init", "--out", base.to_str().unwrap()]).status.success());
    let o = rl(&[
        "sft",
        "@",
        "configs/reverse_text/sft.toml",
        "--output-dir",
        tmp.path().to_str().unwrap(),
        "--model.path",
        base.to_str().unwrap(),
        "--max-steps",
        "30",
        "--batch-size",
        "4",
        "--val.interval",
        "5",
        "--val.num-examples",
        "4",
        "--val.stop-below",
        "100",
        "--scheduler.warmup-steps",
        "0",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let run = tmp.path().join("reverse-text-sft");
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 5, "stopped at the first validation (step 5)");
    assert!(rows[4]["val_loss"].as_f64().is_some());
    // Each step says where its time went.
    for key in ["time/forward_s", "time/backward_s", "time/optimizer_s"] {
        assert!(rows.iter().all(|r| r[key].as_f64().is_some_and(|s| s > 0.0)), "{key}: {}", rows[0]);
    }
    assert!(run.join("model/model.safetensors").exists(), "the model of the stopping step is written");
    // A threshold that is not a positive loss is refused.
    let bad = rl(&["sft", "@", "configs/reverse_text/sft.toml", "--val.stop-below", "0", "--dry-run"]);
    assert!(!bad.status.success() && stderr(&bad).contains("stop_below"), "{}", stderr(&bad));
}

/// `data.groups` with `data.balance`: every step logs each group's share, the re-weighing steps
/// each group's held-out loss with the share the rule gives it, the shares decide where the
/// examples come from, and a resume between re-weighings draws what the uninterrupted run drew.
#[test]
fn balanced_groups_follow_their_losses_and_resume_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("tiny");
    assert!(rl(&["model", "init", "--out", base.to_str().unwrap()]).status.success());
    let out = tmp.path().to_str().unwrap();
    let args = |extra: &[&'static str]| {
        let mut a = vec![
            "sft",
            "--output-dir",
            out,
            "--model.path",
            base.to_str().unwrap(),
            "--run.name",
            "balanced",
            "--max-steps",
            "12",
            "--batch-size",
            "4",
            "--seq-len",
            "1024",
            "--scheduler",
            r#"{"type": "constant"}"#,
            "--ckpt",
            r#"{"interval": 4, "keep_last": 5}"#,
            "--data",
            r#"{"task": "alphabet-sort", "num_examples": 64,
                "args": {"min_turns": 1, "max_turns": 1, "min_names": 2, "max_names": 3},
                "groups": [{"sort_by": "first"}, {"sort_by": "last"}],
                "balance": {"interval": 5, "num_examples": 4, "power": 100.0, "min_share": 0.05}}"#,
        ];
        a.extend_from_slice(extra);
        a
    };
    let o = rl(&args(&[]));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(crate::stdout(&o).contains("in 2 groups (sort_by=first: 32, sort_by=last: 32)"), "{}", crate::stdout(&o));
    assert!(crate::stdout(&o).contains("data groups re-weighed: sort_by=first loss"), "{}", crate::stdout(&o));
    let read = || metrics_rows(&tmp.path().join("balanced/metrics.jsonl"));
    let rows = read();
    assert_eq!(rows.len(), 12);
    let (first, last) = ("group/sort_by=first", "group/sort_by=last");
    for row in &rows {
        let step = row["step"].as_u64().unwrap();
        let shares = [row[format!("{first}/share")].as_f64().unwrap(), row[format!("{last}/share")].as_f64().unwrap()];
        assert!((shares[0] + shares[1] - 1.0).abs() < 1e-9, "{row}");
        let losses = [row[format!("{first}/val_loss")].as_f64(), row[format!("{last}/val_loss")].as_f64()];
        if [1, 6, 11].contains(&step) {
            let losses = [losses[0].unwrap(), losses[1].unwrap()];
            let expected = rl_trainer::shares_from_lags(&losses, 100.0, 0.05);
            assert!((shares[0] - expected[0]).abs() < 1e-9, "step {step}: {row}");
            assert!(shares[0] != 0.5, "a power of 100 makes unequal losses' shares unequal: {row}");
        } else {
            assert!(losses == [None, None], "losses only on re-weighing steps: {row}");
            let before = &rows[step as usize - 2];
            assert_eq!(row[format!("{first}/share")], before[format!("{first}/share")], "step {step}");
        }
    }
    // Resuming from step 8 (shares of step 6 in force) trains steps 9-12 again, the same way.
    let o = rl(&args(&["--resume.step", "8"]));
    assert!(o.status.success(), "{}", stderr(&o));
    let again = read();
    assert_eq!(again.len(), 12);
    for (a, b) in rows.iter().zip(&again) {
        assert_eq!(a["loss"], b["loss"], "step {}", a["step"]);
        assert_eq!(a[format!("{first}/share")], b[format!("{first}/share")], "step {}", a["step"]);
    }
    // Balancing needs groups; a share floor that leaves nothing to weigh is refused.
    let bad = rl(&["sft", "--data", r#"{"task": "alphabet-sort", "balance": {}}"#, "--dry-run"]);
    assert!(!bad.status.success() && stderr(&bad).contains("data.groups"), "{}", stderr(&bad));
}

#[test]
fn balance_by_greedy_exact_match_reports_each_groups_rate_and_follows_it() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("tiny");
    assert!(rl(&["model", "init", "--out", base.to_str().unwrap()]).status.success());
    let o = rl(&[
        "sft",
        "--output-dir",
        tmp.path().to_str().unwrap(),
        "--model.path",
        base.to_str().unwrap(),
        "--run.name",
        "exact",
        "--max-steps",
        "6",
        "--batch-size",
        "4",
        "--seq-len",
        "1024",
        "--data",
        r#"{"task": "alphabet-sort", "num_examples": 32,
            "args": {"min_turns": 1, "max_turns": 1, "min_names": 2, "max_names": 2},
            "groups": [{"sort_by": "first"}, {"sort_by": "last"}],
            "balance": {"signal": "exact", "interval": 3, "num_examples": 5, "power": 2.0, "min_share": 0.1}}"#,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(crate::stdout(&o).contains("sort_by=first loss"), "{}", crate::stdout(&o));
    assert!(crate::stdout(&o).contains(" exact "), "{}", crate::stdout(&o));
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(tmp.path().join("exact/metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 6);
    let keys = ["group/sort_by=first", "group/sort_by=last"];
    for row in &rows {
        let exact: Vec<Option<f64>> = keys.iter().map(|k| row[format!("{k}/exact")].as_f64()).collect();
        if [1, 4].contains(&row["step"].as_u64().unwrap()) {
            // Five one-turn episodes a group: five replies, lag (misses + 1) / 7.
            let lags: Vec<f64> = exact
                .iter()
                .map(|e| {
                    let hits = e.unwrap() * 5.0;
                    assert!((hits - hits.round()).abs() < 1e-9 && (0.0..=5.0).contains(&hits), "{row}");
                    (5.0 - hits + 1.0) / 7.0
                })
                .collect();
            let expected = rl_trainer::shares_from_lags(&lags, 2.0, 0.1);
            for (k, e) in keys.iter().zip(expected) {
                assert!((row[format!("{k}/share")].as_f64().unwrap() - e).abs() < 1e-9, "{row}");
            }
            assert!(row[format!("{}/val_loss", keys[0])].as_f64().is_some(), "{row}");
        } else {
            assert_eq!(exact, [None, None], "rates only on re-weighing steps: {row}");
        }
    }
    let bad = rl(&[
        "sft",
        "--data",
        r#"{"task": "alphabet-sort", "groups": [{}, {}], "balance": {"signal": "reward"}}"#,
        "--dry-run",
    ]);
    assert!(!bad.status.success() && stderr(&bad).contains("expected `loss` or `exact`"), "{}", stderr(&bad));
}

/// prime-rl's SFT data: `data.name` names a Hugging Face dataset, read from the local hub cache (a
/// snapshot of Parquet shards pyarrow wrote: chat rows with tool calls and tools as JSON text, and
/// a prompt/completion `test` split that validates); one not there says how to fetch it.
#[test]
fn sft_reads_a_hugging_face_dataset_from_the_hub_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("tiny");
    assert!(rl(&["model", "init", "--out", base.to_str().unwrap()]).status.success());
    let cache = tmp.path().join("hub");
    let repo = cache.join("datasets--org--chat");
    let shards = repo.join("snapshots/0123abcd/data");
    std::fs::create_dir_all(&shards).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), "0123abcd").unwrap();
    let fixtures = crate::root().join("crates/rl-data/tests/fixtures/data");
    for shard in ["train-00000-of-00001.parquet", "test-00000-of-00001.parquet"] {
        std::fs::copy(fixtures.join(shard), shards.join(shard)).unwrap();
    }
    let sft = |name: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_rl"))
            .args(["sft", "--output-dir", tmp.path().to_str().unwrap(), "--model.path", base.to_str().unwrap()])
            .args(["--data.name", name, "--data.val-split", "test", "--val", r#"{"interval": 1, "num_examples": 2}"#])
            .args(["--max-steps", "2", "--batch-size", "2", "--seq-len", "256", "--run.name", "hf", "--clean"])
            .current_dir(crate::root())
            .env("HF_HUB_CACHE", &cache)
            .output()
            .unwrap()
    };
    let o = sft("org/chat");
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(tmp.path().join("hf/metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let vals = rows.iter().filter(|r| r.get("val_loss").is_some_and(|v| v.as_f64().is_some_and(f64::is_finite)));
    assert!(vals.count() >= 2, "the test split validated every step: {rows:?}");
    let o = sft("org/missing");
    assert!(!o.status.success());
    assert!(stderr(&o).contains("hf download org/missing --repo-type dataset"), "{}", stderr(&o));
}

/// `batch_rows` (prime-rl's `data.batch_size`): each step takes the examples that fill its packed
/// rows, counted in the metrics, and a resume starts where the uninterrupted run's step started.
#[test]
fn batch_rows_fill_packed_rows_and_resume_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("tiny");
    assert!(rl(&["model", "init", "--out", base.to_str().unwrap()]).status.success());
    let out = tmp.path().to_str().unwrap();
    let args = |extra: &[&'static str]| {
        let mut a = vec!["sft", "--output-dir", out, "--model.path", base.to_str().unwrap(), "--run.name", "rows"];
        a.extend(["--max-steps", "6", "--batch-rows", "2", "--seq-len", "160", "--ckpt", r#"{"interval": 3}"#]);
        a.extend(["--data", r#"{"task": "reverse-text", "num_examples": 64}"#]);
        a.extend_from_slice(extra);
        a
    };
    let o = rl(&args(&[]));
    assert!(o.status.success(), "{}", stderr(&o));
    let read = || metrics_rows(&tmp.path().join("rows/metrics.jsonl"));
    let rows = read();
    assert_eq!(rows.len(), 6);
    for row in &rows {
        let (samples, tokens) = (row["samples"].as_u64().unwrap(), row["tokens"].as_u64().unwrap());
        assert!(samples >= 2 && tokens <= 2 * 160, "two rows of 160 tokens hold several examples: {row}");
    }
    let o = rl(&args(&["--resume.step", "3"]));
    assert!(o.status.success(), "{}", stderr(&o));
    let again = read();
    assert_eq!(again.len(), 6);
    for (a, b) in rows.iter().zip(&again) {
        assert_eq!((&a["loss"], &a["samples"]), (&b["loss"], &b["samples"]), "step {}", a["step"]);
    }
    // Two ways of sizing a step at once are refused.
    let both = rl(&["sft", "--batch-size", "4", "--batch-rows", "2", "--dry-run"]);
    assert!(!both.status.success() && stderr(&both).contains("batch_rows"), "{}", stderr(&both));
}

/// The rows of a run's `metrics.jsonl`.
fn metrics_rows(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}
