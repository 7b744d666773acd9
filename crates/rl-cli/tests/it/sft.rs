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
            },
            TemplateMessage { role: "user".into(), content: text.clone(), tool_calls: vec![] },
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
    assert!(run.join("model/model.safetensors").exists(), "the model of the stopping step is written");
    // A threshold that is not a positive loss is refused.
    let bad = rl(&["sft", "@", "configs/reverse_text/sft.toml", "--val.stop-below", "0", "--dry-run"]);
    assert!(!bad.status.success() && stderr(&bad).contains("stop_below"), "{}", stderr(&bad));
}
