//! Two full steps against a real reverse-text env server, a scripted model endpoint and a fake
//! trainer: batch files, the training context each request carried, the weight-update calls.

use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use rl_configs::{OrchestratorConfig, ServeConfig, TrainEnvConfig};
use rl_orchestrator::Orchestrator;
use rl_proto::train::v1::TrainBatch;
use rl_serve::fake_model::{FakeModel, FakeReply, FakeRequest};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_steps_with_a_real_env_server_and_a_fake_trainer() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().to_owned();
    // Even seeds answer correctly (with chatter outside the tags), odd seeds without tags.
    let model = FakeModel::start(|r: &FakeRequest| {
        let rev: String = r.last_user().chars().rev().collect();
        let seed = r.body["seed"].as_u64().unwrap_or(0);
        FakeReply::Text(if seed.is_multiple_of(2) {
            format!("Sure! <reversed_text>{rev}</reversed_text>")
        } else {
            rev
        })
    })
    .await;
    let args = serde_json::json!({"num_examples": 50, "min_len": 3, "max_len": 8, "format_penalty": 0.5, "penalty_warmup_steps": 2});
    let env = rl_envs::load("reverse-text", args.as_object().unwrap()).unwrap();
    let serve = ServeConfig::default();
    let listener = rl_serve::bind(&serve).await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { rl_serve::serve(Arc::clone(&env), &serve, listener, std::future::pending()).await });

    // The fake trainer: after batch n appears, "trains" and broadcasts step n.
    let trainer_run = run.clone();
    let trainer = tokio::spawn(async move {
        let mut batches = Vec::new();
        for step in 1..=2u64 {
            let path = trainer_run.join(format!("rollouts/step_{step}/rank_0.bin"));
            while !path.exists() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            batches.push(TrainBatch::decode(std::fs::read(&path).unwrap().as_slice()).unwrap());
            let dir = trainer_run.join(format!("broadcasts/step_{step}"));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("STABLE"), b"").unwrap();
        }
        batches
    });

    let mut env_cfg = TrainEnvConfig::new("reverse-text");
    env_cfg.address = Some(address);
    let mut cfg = OrchestratorConfig {
        batch_size: 8,
        group_size: 4,
        max_steps: Some(2),
        max_async_level: 0,
        seq_len: 256,
        ..Default::default()
    };
    cfg.model.base_url = model.base_url.clone();
    cfg.model.name = Some(String::from("fake"));
    cfg.train.sampling.temperature = 0.8;
    cfg.train.sampling.seed = Some(0);
    cfg.train.sampling.max_completion_tokens = Some(64);
    cfg.train.env = vec![env_cfg];
    cfg.output_dir = run.clone();
    cfg.wait_for_ready_s = 10.0;
    let mut orch = Orchestrator::connect(&cfg).await.unwrap();
    let mut summaries = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), orch.run(1, |s| summaries.push(s.clone()))).await.unwrap().unwrap();
    let batches = trainer.await.unwrap();

    assert_eq!(batches.len(), 2);
    for (i, b) in batches.iter().enumerate() {
        assert_eq!(b.step, i as u64 + 1);
        assert_eq!(b.env_names, vec![String::from("reverse-text")]);
        assert!(!b.micro_batches.is_empty());
        for mb in &b.micro_batches {
            assert!(mb.input_ids.len() <= 256);
            assert!(mb.temperatures.iter().all(|t| *t == 0.8), "the env's temperature is fanned out");
            assert!(mb.loss_mask.iter().any(|m| *m));
            assert!(mb.advantages.iter().any(|a| *a != 0.0));
        }
    }
    // Step-aware penalty: scale = 0.5 * step / 2. Half the rollouts score 1, half 0, all penalised.
    let reward = |i: usize| summaries[i].metrics["reward/mean"].as_f64().unwrap();
    assert!((reward(0) - 0.25).abs() < 1e-9, "step 1 scored with training_context.step = 1: {}", reward(0));
    assert!(reward(1).abs() < 1e-9, "step 2 scored with training_context.step = 2: {}", reward(1));
    // Step 2 waited for the policy trained on step 1 (async level 0) and sampled with it.
    let updates = model.weight_updates();
    assert!(!updates.is_empty());
    assert!(updates[0]["weight_dir"].as_str().unwrap().ends_with("broadcasts/step_1"), "{updates:?}");
    assert_eq!(summaries[1].metrics["policy_version"], 1);
    let salts: Vec<String> =
        model.requests().iter().map(|r| r["cache_salt"].as_str().unwrap_or("").to_owned()).collect();
    assert_eq!(salts.iter().filter(|s| *s == "0").count(), 8, "step 1 rollouts carry cache_salt 0");
    assert_eq!(salts.iter().filter(|s| *s == "1").count(), 8, "step 2 rollouts carry cache_salt 1");
    assert!(run.join("metrics.jsonl").exists());
}
