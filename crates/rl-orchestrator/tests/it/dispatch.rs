//! Full orchestrator runs against real env servers from rl-envs, a scripted model endpoint and a
//! fake trainer: batch files, the training context each request carried, weight-update calls,
//! staleness drops, resume from a checkpoint, online eval, and model-scored / env-owned algorithms.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use rl_configs::{
    AlgorithmConfig, CkptConfig, EvalConfig, EvalEnvConfig, ModelEndpointConfig, OrchestratorConfig, ResumeConfig,
    ServeConfig, TrainEnvConfig,
};
use rl_orchestrator::{Orchestrator, StepSummary};
use rl_proto::train::v1::TrainBatch;
use rl_run::RunDir;
use rl_serve::fake_model::{FakeModel, FakeReply, FakeRequest, TOKEN_LOGPROB, prompt_logprob};

/// Starts a real env server for `id` on 127.0.0.1:0 and returns its address.
async fn env_server(id: &str, args: serde_json::Value) -> String {
    let env = rl_envs::load(id, args.as_object().unwrap()).await.unwrap();
    let serve = ServeConfig::default();
    let listener = rl_serve::bind(&serve).await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { rl_serve::serve(Arc::clone(&env), &serve, listener, std::future::pending()).await });
    address
}

/// Even seeds answer correctly (with chatter outside the tags), odd seeds without tags.
async fn reverse_text_model() -> FakeModel {
    FakeModel::start(|r: &FakeRequest| {
        let rev: String = r.last_user().chars().rev().collect();
        let seed = r.body["seed"].as_u64().unwrap_or(0);
        FakeReply::Text(if seed.is_multiple_of(2) {
            format!("Sure! <reversed_text>{rev}</reversed_text>")
        } else {
            rev
        })
    })
    .await
}

/// The fake trainer: after batch n appears (n in `steps`), waits `delay`, then broadcasts step n.
/// A step's metrics row as users read it in `metrics.jsonl`.
fn row(s: &StepSummary) -> serde_json::Value {
    serde_json::to_value(&s.metrics).unwrap()
}

fn fake_trainer(
    run: &Path,
    steps: std::ops::RangeInclusive<u64>,
    delay: Duration,
) -> tokio::task::JoinHandle<Vec<TrainBatch>> {
    let run = run.to_owned();
    tokio::spawn(async move {
        let mut batches = Vec::new();
        for step in steps {
            let path = RunDir::new(&run).batch(step);
            // Waits for a complete batch of this step (a stale file left by a test is not one).
            let batch = loop {
                let decoded = std::fs::read(&path).ok().and_then(|b| TrainBatch::decode(b.as_slice()).ok());
                if let Some(b) = decoded.filter(|b| b.step == step) {
                    break b;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            batches.push(batch);
            tokio::time::sleep(delay).await;
            let dir = RunDir::new(&run).broadcast(step);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(RunDir::new(&run).broadcast_marker(step), b"").unwrap();
        }
        batches
    })
}

fn config(run: &Path, model: &FakeModel, env_address: String, steps: u64) -> OrchestratorConfig {
    let mut env_cfg = TrainEnvConfig::new("reverse-text");
    env_cfg.address = Some(env_address);
    let mut cfg = OrchestratorConfig {
        batch_size: 8,
        group_size: 4,
        max_steps: Some(steps),
        max_async_level: 0,
        seq_len: 256,
        ..Default::default()
    };
    cfg.model.base_url = model.base_url.clone().into();
    cfg.model.name = Some(String::from("fake"));
    cfg.train.sampling.temperature = rl_configs::Temperature::new(0.8).unwrap();
    cfg.train.sampling.seed = Some(0);
    cfg.train.sampling.max_completion_tokens = Some(64);
    cfg.train.env = vec![env_cfg];
    cfg.output_dir = run.to_owned();
    cfg.wait_for_ready_s = 10.0;
    cfg
}

async fn run(cfg: &OrchestratorConfig) -> Vec<StepSummary> {
    let mut orch = Orchestrator::connect(cfg).await.unwrap();
    let mut summaries = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), orch.run(|s| summaries.push(s.clone()))).await.unwrap().unwrap();
    summaries
}

fn salts(model: &FakeModel) -> Vec<String> {
    model.requests().iter().map(|r| r["cache_salt"].as_str().unwrap_or("").to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_steps_with_a_real_env_server_and_a_fake_trainer() {
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().to_owned();
    let model = reverse_text_model().await;
    let args = serde_json::json!({"num_examples": 50, "min_len": 3, "max_len": 8, "format_penalty": 0.5, "penalty_warmup_steps": 2});
    let address = env_server("reverse-text", args).await;
    let trainer = fake_trainer(&run_dir, 1..=2, Duration::ZERO);
    let summaries = run(&config(&run_dir, &model, address, 2)).await;
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
    let reward = |i: usize| row(&summaries[i])["reward/mean"].as_f64().unwrap();
    assert!((reward(0) - 0.25).abs() < 1e-9, "step 1 scored with training_context.step = 1: {}", reward(0));
    assert!(reward(1).abs() < 1e-9, "step 2 scored with training_context.step = 2: {}", reward(1));
    // Step 2 waited for the policy trained on step 1 (async level 0) and sampled with it.
    let updates = model.weight_updates();
    assert!(!updates.is_empty());
    assert!(
        updates[0]["weight_dir"].as_str().unwrap().ends_with(RunDir::new("").broadcast(1).to_str().unwrap()),
        "{updates:?}"
    );
    assert_eq!(row(&summaries[1])["policy_version"], 1);
    let salts = salts(&model);
    assert_eq!(salts.iter().filter(|s| *s == "0").count(), 8, "step 1 rollouts carry cache_salt 0");
    assert_eq!(salts.iter().filter(|s| *s == "1").count(), 8, "step 2 rollouts carry cache_salt 1");
    assert!(RunDir::new(&run_dir).metrics().exists());
    assert_eq!(row(&summaries[0])["stale_dropped"], 0);
    // What the policy wrote is readable per step.
    let traces: Vec<serde_json::Value> = std::fs::read_to_string(RunDir::new(&run_dir).traces(1))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(traces.len(), 8);
    let answered = traces.iter().filter(|t| t["messages"][2]["content"].as_str().unwrap().contains("<reversed_text>"));
    assert_eq!(answered.count(), 4, "half the seeds answer in tags");
    assert!(traces.iter().all(|t| t["env"] == "reverse-text" && t["task"].as_str().unwrap().starts_with("train/")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_older_than_max_off_policy_steps_are_dropped_counted_and_refilled() {
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().to_owned();
    let model = reverse_text_model().await;
    let address = env_server("reverse-text", serde_json::json!({"num_examples": 50})).await;
    // The trainer is slow: step 2 may start on policy v0 (async level 1) but may only train on
    // groups at most 0 versions old, so its first groups are stale.
    let trainer = fake_trainer(&run_dir, 1..=2, Duration::from_millis(400));
    let mut cfg = config(&run_dir, &model, address, 2);
    cfg.max_async_level = 1;
    cfg.max_off_policy_steps = 0;
    let summaries = run(&cfg).await;
    trainer.await.unwrap();
    assert_eq!(row(&summaries[0])["stale_dropped"], 0);
    assert_eq!(row(&summaries[1])["stale_dropped"], 2, "both step-2 groups were sampled by v0");
    assert_eq!(row(&summaries[1])["policy_version"], 1);
    assert_eq!(row(&summaries[1])["off_policy_steps"], 0);
    let salts = salts(&model);
    assert_eq!(salts.iter().filter(|s| *s == "0").count(), 16, "step 1 plus the dropped step-2 groups");
    assert_eq!(salts.iter().filter(|s| *s == "1").count(), 8, "the refill used v1");
}

fn read_batch(run: &Path, step: u64) -> Vec<u8> {
    std::fs::read(RunDir::new(run).batch(step)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_continues_from_the_checkpoint_exactly_like_an_uninterrupted_run() {
    resume_matches_an_uninterrupted_run(rl_configs::CurriculumConfig::Uniform {}).await;
}

/// With a difficulty curriculum, a resume restores the pools: the same tasks are drawn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_with_a_difficulty_curriculum_draws_the_same_tasks() {
    let pool = |name: &str, threshold: f64, weight: f64| rl_configs::DifficultyPool {
        name: name.to_owned(),
        threshold,
        weight,
    };
    resume_matches_an_uninterrupted_run(rl_configs::CurriculumConfig::DifficultyPool {
        pools: vec![pool("hard", 0.1, 0.5), pool("rest", 1.0, 2.0)],
        unseen_weight: 1.0,
    })
    .await;
}

async fn resume_matches_an_uninterrupted_run(curriculum: rl_configs::CurriculumConfig) {
    let model = reverse_text_model().await;
    let address = env_server("reverse-text", serde_json::json!({"num_examples": 500})).await;
    // Uninterrupted: 3 steps.
    let full = tempfile::tempdir().unwrap();
    let trainer = fake_trainer(full.path(), 1..=3, Duration::ZERO);
    let mut full_cfg = config(full.path(), &model, address.clone(), 3);
    full_cfg.train.env[0].curriculum = curriculum.clone();
    run(&full_cfg).await;
    trainer.await.unwrap();

    // Interrupted after step 2 (checkpoint every 2 steps), with a stale step-3 batch and broadcast
    // left behind; then resumed to step 3.
    let part = tempfile::tempdir().unwrap();
    let dir: PathBuf = part.path().to_owned();
    let mut cfg = config(&dir, &model, address, 2);
    cfg.train.env[0].curriculum = curriculum;
    cfg.ckpt = Some(CkptConfig { interval: 2, keep_last: None, dir: None });
    let trainer = fake_trainer(&dir, 1..=2, Duration::ZERO);
    run(&cfg).await;
    trainer.await.unwrap();
    assert!(RunDir::new(&dir).orchestrator_state(2).exists());
    let rd = RunDir::new(&dir);
    std::fs::create_dir_all(rd.rollout_step(3)).unwrap();
    std::fs::write(rd.batch(3), b"stale").unwrap();
    std::fs::create_dir_all(rd.broadcast(3)).unwrap();
    std::fs::write(rd.broadcast_marker(3), b"").unwrap();

    let updates_before = model.weight_updates().len();
    cfg.max_steps = Some(3);
    cfg.resume = Some(ResumeConfig { step: None });
    let trainer = fake_trainer(&dir, 3..=3, Duration::ZERO);
    let summaries = run(&cfg).await;
    trainer.await.unwrap();
    assert_eq!(summaries.iter().map(|s| s.step).collect::<Vec<_>>(), vec![3]);
    let updates = &model.weight_updates()[updates_before..];
    assert!(
        updates[0]["weight_dir"].as_str().unwrap().ends_with(RunDir::new("").broadcast(2).to_str().unwrap()),
        "{updates:?}"
    );
    assert_eq!(read_batch(&dir, 3), read_batch(full.path(), 3), "same tasks, same policy version, same batch");
    let steps: Vec<u64> = std::fs::read_to_string(RunDir::new(&dir).metrics())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, vec![1, 2, 3]);

    // A resume without a checkpoint is an error, not a cold start.
    let empty = tempfile::tempdir().unwrap();
    cfg.output_dir = empty.path().to_owned();
    let err = Orchestrator::connect(&cfg).await.unwrap_err().to_string();
    assert!(err.contains("no orchestrator checkpoint"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn online_eval_reports_avg_and_pass_at_k() {
    let tmp = tempfile::tempdir().unwrap();
    let model = reverse_text_model().await;
    let args = serde_json::json!({"num_examples": 20, "test_examples": 5});
    let train = env_server("reverse-text", args.clone()).await;
    let eval_address = env_server("reverse-text", args).await;
    let trainer = fake_trainer(tmp.path(), 1..=3, Duration::ZERO);
    let mut cfg = config(tmp.path(), &model, train, 3);
    let mut eval_env = EvalEnvConfig {
        id: String::from("reverse-text"),
        name: None,
        args: Default::default(),
        split: String::from("test"),
        num_examples: Some(3),
        k: None,
        sampling: Default::default(),
        interval: None,
        address: Some(eval_address.clone()),
        command: None,
        serve: ServeConfig::default(),
    };
    eval_env.sampling.seed = Some(1);
    // A second env on its own interval: every step.
    let mut every_step = eval_env.clone();
    every_step.name = Some(String::from("every-step"));
    every_step.interval = Some(1);
    cfg.eval = Some(EvalConfig {
        interval: 2,
        eval_on_start: true,
        num_examples: None,
        k: 4,
        env: vec![eval_env, every_step],
        ..Default::default()
    });
    let summaries = run(&cfg).await;
    trainer.await.unwrap();
    assert!(row(&summaries[0]).get("eval/reverse-text/avg@4").is_none(), "interval 2: no eval at step 1");
    assert!(row(&summaries[0]).get("eval/every-step/avg@4").is_some(), "the env's own interval 1: eval at step 1");
    assert!(row(&summaries[1]).get("eval/every-step/avg@4").is_some());
    // The last step evaluates the final policy, on the interval or not.
    assert!(row(&summaries[2]).get("eval/reverse-text/avg@4").is_some(), "no eval at the last step (3)");
    let m = &row(&summaries[1]);
    // Seeds 1..: sample i of a group uses seed 1 + i, so half the samples answer in tags (reward 1).
    assert_eq!(m["eval/reverse-text/examples"], 3);
    assert_eq!(m["eval/reverse-text/avg@4"], 0.5);
    assert_eq!(m["eval/reverse-text/pass@1"], 0.5);
    assert_eq!(m["eval/reverse-text/pass@4"], 1.0);
    assert_eq!(m["eval/reverse-text/policy_version"], 1);
    // Each evaluation's rollouts are in its traces file, every env's, tagged with its name.
    let eval_traces = |step: u64| -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(RunDir::new(tmp.path()).eval_traces(step)).unwrap();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    let at_start = eval_traces(0);
    assert_eq!(at_start.len(), 2 * 3 * 4, "two envs x 3 examples x k = 4");
    let envs: std::collections::BTreeSet<&str> = at_start.iter().map(|t| t["env"].as_str().unwrap()).collect();
    assert_eq!(envs, ["every-step", "reverse-text"].into());
    assert!(
        at_start.iter().all(|t| t["task"].as_str().unwrap().starts_with("test/")),
        "eval tasks come from the test split"
    );
    let at_2 = eval_traces(2);
    let solved = at_2.iter().filter(|t| t["env"] == "reverse-text" && t["reward"].as_f64().unwrap() > 0.0).count();
    assert_eq!(solved, 6, "avg@4 of 0.5 over 3 examples: 6 of the 12 rollouts");
    assert!(at_2.iter().all(|t| t["policy_version"] == 1 && t["messages"].as_array().unwrap().len() >= 2));
    assert_eq!(eval_traces(1).len(), 3 * 4, "step 1: the every-step env alone");
    // The same evaluation standalone (`rl eval`): eval envs only, no training envs needed.
    let mut standalone = cfg.clone();
    standalone.train.env[0].address = None;
    let metrics = Orchestrator::connect_for_eval(&standalone).await.unwrap().evaluate_now().await.unwrap();
    assert_eq!(metrics["eval/reverse-text/avg@4"], 0.5);
    assert_eq!(metrics["eval/reverse-text/pass@4"], 1.0);
    let first = std::fs::read_to_string(RunDir::new(tmp.path()).metrics()).unwrap();
    let first: serde_json::Value = serde_json::from_str(first.lines().next().unwrap()).unwrap();
    assert_eq!(first["step"], 0, "eval_on_start writes a step-0 row");
    assert_eq!(first["eval/reverse-text/avg@4"], 0.5);
    assert!(first.get("eval/every-step/avg@4").is_some(), "eval_on_start evaluates every env");
    // More examples than the split holds (5) is an error naming the key, not a quiet cut.
    standalone.eval.as_mut().unwrap().env[0].num_examples = Some(6);
    let err = Orchestrator::connect_for_eval(&standalone).await.err().unwrap().to_string();
    assert!(err.contains("orchestrator.eval.env.num_examples") && err.contains("holds 5 tasks"), "{err}");
    standalone.eval.as_mut().unwrap().env[0].num_examples = None;
    standalone.eval.as_mut().unwrap().num_examples = Some(9);
    let err = Orchestrator::connect_for_eval(&standalone).await.err().unwrap().to_string();
    assert!(err.contains("`orchestrator.eval.num_examples` is 9"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_truncated_completions_scores_replies_cut_at_the_token_limit_as_zero() {
    // Every reply is right; even seeds ramble on after the answer past the 64-token limit (the
    // fake model's tokens are bytes), so the answer is scored 1 but the reply is cut.
    let model = FakeModel::start(|r: &FakeRequest| {
        let rev: String = r.last_user().chars().rev().collect();
        let ramble =
            if r.body["seed"].as_u64().unwrap_or(0).is_multiple_of(2) { " and so on".repeat(8) } else { String::new() };
        FakeReply::Text(format!("<reversed_text>{rev}</reversed_text>{ramble}"))
    })
    .await;
    let args = serde_json::json!({"num_examples": 20, "min_len": 3, "max_len": 8});
    let mut mean_and_truncated = Vec::new();
    for zero in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let address = env_server("reverse-text", args.clone()).await;
        let trainer = fake_trainer(tmp.path(), 1..=1, Duration::ZERO);
        let mut cfg = config(tmp.path(), &model, address, 1);
        cfg.zero_truncated_completions = zero;
        let summaries = run(&cfg).await;
        let batches = trainer.await.unwrap();
        let m = row(&summaries[0]);
        mean_and_truncated.push((m["reward/mean"].as_f64().unwrap(), m["truncated"].as_f64().unwrap()));
        // Without zeroing every group is uniform (all 1): nothing trains. With it the cut
        // replies are pushed down and the whole ones up.
        let advantages: Vec<f32> =
            batches.iter().flat_map(|b| &b.micro_batches).flat_map(|mb| mb.advantages.clone()).collect();
        assert_eq!(advantages.iter().any(|a| *a < 0.0), zero, "zero = {zero}");
        assert_eq!(advantages.iter().any(|a| *a > 0.0), zero, "zero = {zero}");
    }
    assert_eq!(mean_and_truncated, vec![(1.0, 0.5), (0.5, 0.5)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refill_rounds_replace_the_rollouts_of_uniform_groups_with_fresh_tasks() {
    // Texts of even length are always reversed right (a uniform group: nothing to learn); odd
    // ones right for even seeds only (half 1, half 0).
    let model = FakeModel::start(|r: &FakeRequest| {
        let text = r.last_user();
        let rev: String = text.chars().rev().collect();
        let easy = text.chars().count().is_multiple_of(2);
        let seed = r.body["seed"].as_u64().unwrap_or(0);
        FakeReply::Text(if easy || seed.is_multiple_of(2) {
            format!("<reversed_text>{rev}</reversed_text>")
        } else {
            rev
        })
    })
    .await;
    let args = serde_json::json!({"num_examples": 200, "min_len": 3, "max_len": 12});
    let steps = 4;
    let mut trained = Vec::new();
    for rounds in [0, 8] {
        let tmp = tempfile::tempdir().unwrap();
        let address = env_server("reverse-text", args.clone()).await;
        let trainer = fake_trainer(tmp.path(), 1..=steps, Duration::ZERO);
        let mut cfg = config(tmp.path(), &model, address, steps);
        cfg.max_refill_rounds = rounds;
        let summaries = run(&cfg).await;
        trainer.await.unwrap();
        let rows: Vec<serde_json::Value> = summaries.iter().map(row).collect();
        trained.push(rows.iter().map(|m| m["samples"].as_u64().unwrap()).collect::<Vec<_>>());
        if rounds == 0 {
            assert!(rows.iter().all(|m| m.get("refill/rounds").is_none()), "no refill metrics when off");
        } else {
            let kept: u64 = rows.iter().map(|m| m["refill/groups_kept"].as_u64().unwrap()).sum();
            assert!(kept > 0, "uniform groups were replaced: {rows:?}");
            assert!(rows.iter().all(|m| m["refill/rounds"].as_u64().unwrap() <= 8));
            // A step refills only when a planned group was uniform, here solved (reward 1); the
            // kept refills are half right, so they pull the step's mean below the planned round's.
            for m in &rows {
                let (planned, mean) =
                    (m["refill/planned_reward"].as_f64().unwrap(), m["reward/mean"].as_f64().unwrap());
                if m["refill/groups_kept"].as_u64().unwrap() > 0 {
                    assert!(planned > mean + 1e-9, "{m:?}");
                } else {
                    assert!((planned - mean).abs() < 1e-9, "{m:?}");
                }
            }
        }
    }
    // Off, a uniform group leaves its step short of the batch's 8 rollouts that teach; on, every
    // step trains exactly 8 (two half-right groups; refills past the gap are discarded).
    assert!(trained[0].iter().any(|n| *n < 8), "{trained:?}");
    assert_eq!(trained[1], vec![8; steps as usize], "{trained:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_greedy_baseline_runs_one_untrained_greedy_rollout_beside_each_group() {
    let tmp = tempfile::tempdir().unwrap();
    // Greedy requests answer correctly (reward 1); samples as `reverse_text_model` (half 1, half 0).
    let model = FakeModel::start(|r: &FakeRequest| {
        let rev: String = r.last_user().chars().rev().collect();
        let greedy = r.body["temperature"].as_f64() == Some(0.0);
        let seed = r.body["seed"].as_u64().unwrap_or(0);
        FakeReply::Text(if greedy || seed.is_multiple_of(2) {
            format!("<reversed_text>{rev}</reversed_text>")
        } else {
            rev
        })
    })
    .await;
    let address = env_server("reverse-text", serde_json::json!({"num_examples": 20})).await;
    let trainer = fake_trainer(tmp.path(), 1..=1, Duration::ZERO);
    let mut cfg = config(tmp.path(), &model, address, 1);
    cfg.algorithms = vec![serde_json::from_value(serde_json::json!({"id": "grpo", "baseline": "greedy"})).unwrap()];
    let summaries = run(&cfg).await;
    let batches = trainer.await.unwrap();
    let greedy_requests = model.requests().iter().filter(|r| r["temperature"].as_f64() == Some(0.0)).count();
    assert_eq!(greedy_requests, 2, "one greedy rollout per group (8 rollouts in groups of 4)");
    let m = row(&summaries[0]);
    assert_eq!(m["env/reverse-text/reward_greedy"], 1.0);
    assert_eq!(m["reward/mean"], 0.5, "the greedy rollouts are not among the step's rollouts");
    // Against the greedy reward (1) the correct samples get 0 and the rest -1: nothing is pushed
    // up, where the group mean (0.5) would have pushed the correct half up.
    let advantages: Vec<f32> = batches[0].micro_batches.iter().flat_map(|mb| mb.advantages.clone()).collect();
    assert!(advantages.iter().all(|a| *a <= 0.0) && advantages.iter().any(|a| *a == -1.0), "{advantages:?}");
    for mb in &batches[0].micro_batches {
        assert!(mb.temperatures.iter().all(|t| *t == 0.8), "only sampled rollouts are trained");
    }
    let traces = std::fs::read_to_string(RunDir::new(tmp.path()).traces(1)).unwrap();
    assert_eq!(traces.lines().count(), 8, "the greedy rollouts are not written as the step's traces");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opd_scores_with_the_reference_model_with_bounded_concurrency() {
    let tmp = tempfile::tempdir().unwrap();
    let model = reverse_text_model().await;
    let reference = FakeModel::start(|_: &FakeRequest| FakeReply::Text(String::new())).await;
    let address = env_server("reverse-text", serde_json::json!({"num_examples": 20})).await;
    let trainer = fake_trainer(tmp.path(), 1..=1, Duration::ZERO);
    let mut cfg = config(tmp.path(), &model, address, 1);
    cfg.models.insert(
        String::from("ref"),
        ModelEndpointConfig {
            base_url: reference.base_url.clone(),
            name: String::from("ref"),
            tokens: true,
            timeout_s: 10.0,
            api_key_env: None,
            headers: Default::default(),
        },
    );
    let opd: AlgorithmConfig =
        serde_json::from_value(serde_json::json!({"id": "opd", "model": "ref", "max_concurrent": 2})).unwrap();
    cfg.algorithms = vec![opd];
    run(&cfg).await;
    let batch = &trainer.await.unwrap()[0];
    let (served, most) = reference.scoring_stats();
    assert_eq!(served, 8, "one scoring request per branch");
    assert!(most <= 2, "at most max_concurrent scoring requests in flight, saw {most}");
    assert_eq!(most, 2, "and the bound is used");
    let mut checked = 0;
    for mb in &batch.micro_batches {
        for i in 0..mb.input_ids.len() {
            if mb.loss_mask[i] {
                let expected = prompt_logprob(mb.input_ids[i]) - TOKEN_LOGPROB;
                assert!((mb.advantages[i] - expected).abs() < 1e-6, "token {i}: {} vs {expected}", mb.advantages[i]);
                checked += 1;
            }
        }
    }
    assert!(checked > 50, "per-token advantages = reference logprob - inference logprob");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_owned_algorithms_run_on_the_env_server() {
    let tmp = tempfile::tempdir().unwrap();
    let model = reverse_text_model().await;
    let address = env_server("reverse-text", serde_json::json!({"num_examples": 20})).await;
    let trainer = fake_trainer(tmp.path(), 1..=1, Duration::ZERO);
    let mut cfg = config(tmp.path(), &model, address.clone(), 1);
    cfg.algorithms = vec![AlgorithmConfig::from_id("rloo")];
    run(&cfg).await;
    let batch = &trainer.await.unwrap()[0];
    // Groups of 4 with seeds 0..3: rewards 1, 0, 1, 0. RLOO: 1 - 1/3 = 2/3 and 0 - 2/3.
    let values: std::collections::BTreeSet<i64> = batch
        .micro_batches
        .iter()
        .flat_map(|mb| {
            mb.advantages.iter().zip(&mb.loss_mask).filter(|(_, m)| **m).map(|(a, _)| (a * 3000.0).round() as i64)
        })
        .collect();
    assert_eq!(values, [-2000i64, 2000].into_iter().collect());

    cfg.algorithms = vec![AlgorithmConfig::from_id("no_such_algorithm")];
    let err = Orchestrator::connect(&cfg).await.unwrap_err().to_string();
    assert!(err.contains("`no_such_algorithm`") && err.contains("rloo"), "{err}");
}

/// Debaters argue (with a private think block), the judge always picks debater_a.
async fn debate_model() -> FakeModel {
    FakeModel::start(|r: &FakeRequest| {
        FakeReply::Text(if r.system().starts_with("You judge") {
            String::from("<verdict>A</verdict>")
        } else {
            String::from("<think>my secret plan</think>I am right.")
        })
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debate_fans_out_per_member_with_rae_and_its_state_survives_a_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let model = debate_model().await;
    let address = env_server("debate", serde_json::json!({"num_examples": 4, "rounds": 1})).await;
    let trainer = fake_trainer(tmp.path(), 1..=2, Duration::ZERO);
    let mut cfg = config(tmp.path(), &model, address.clone(), 2);
    cfg.train.env[0].id = String::from("debate");
    cfg.batch_size = 4;
    cfg.group_size = 2;
    cfg.seq_len = 1024;
    cfg.algorithms = vec![AlgorithmConfig::from_id("rae")];
    cfg.ckpt = Some(CkptConfig { interval: 1, keep_last: None, dir: None });
    let summaries = run(&cfg).await;
    let batches = trainer.await.unwrap();
    // Step 1: 2 groups x 2 episodes x 2 debaters (the judge is dropped). Cold-start RAE with
    // momentum 0.9: the winner (+1) gets 0.9, the loser (-1) gets -0.9 — unless an example repeats
    // within the step, when its second episode sees the updated baseline.
    let values: Vec<f32> = batches[0]
        .micro_batches
        .iter()
        .flat_map(|mb| mb.advantages.iter().zip(&mb.loss_mask).filter(|(_, m)| **m).map(|(a, _)| *a))
        .collect();
    assert!(
        values.iter().any(|a| (a - 0.9).abs() < 1e-6) && values.iter().any(|a| (a + 0.9).abs() < 1e-6),
        "{values:?} {:?}",
        summaries[0]
    );
    // Samples are the segments no other segment continues (shared prompts are packed once).
    let samples: usize = batches[0]
        .micro_batches
        .iter()
        .map(|mb| {
            let prefixes: std::collections::BTreeSet<i32> = mb.parents.iter().copied().filter(|p| *p >= 0).collect();
            mb.seq_lens.len() - prefixes.len()
        })
        .sum();
    assert_eq!(samples, 8, "one sample per debater trace, none for the judge");
    let m = &row(&summaries[0]);
    assert_eq!(m["reward/member/debate/debater_a"], 1.0);
    assert_eq!(m["reward/member/debate/debater_b"], -1.0);
    assert_eq!(m["reward/member/debate/judge"], 0.0);
    // Private text never reaches a peer: the judge's prompts never contain it.
    for req in model.requests() {
        let msgs = req["messages"].as_array().unwrap();
        if msgs[0]["content"].as_str().unwrap().starts_with("You judge") {
            assert!(!req.to_string().contains("secret plan"), "{req}");
            assert!(req.to_string().contains("I am right."));
        }
    }
    // The RAE baselines are checkpointed, and a resume that expects them and cannot find them fails.
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(RunDir::new(tmp.path()).orchestrator_state(2)).unwrap()).unwrap();
    let baselines = state["algorithms"]["debate/rae"].as_object().unwrap();
    assert!(baselines.keys().all(|k| k.ends_with("|debater_a") || k.ends_with("|debater_b")), "{baselines:?}");
    assert!(baselines.keys().any(|k| k.ends_with("|debater_a")));
    let mut resume = cfg.clone();
    resume.resume = Some(ResumeConfig { step: Some(2) });
    resume.max_steps = Some(3);
    Orchestrator::connect(&resume).await.expect("the state is there");
    let path = RunDir::new(tmp.path()).orchestrator_state(2);
    let mut broken = state.clone();
    broken["algorithms"] = serde_json::json!({});
    std::fs::write(&path, broken.to_string()).unwrap();
    let err = Orchestrator::connect(&resume).await.unwrap_err().to_string();
    assert!(err.contains("debate/rae"), "{err}");

    // grpo on a multi-agent env is rejected at start.
    cfg.algorithms = vec![AlgorithmConfig::from_id("grpo")];
    cfg.ckpt = None;
    let err = Orchestrator::connect(&cfg).await.unwrap_err().to_string();
    assert!(err.contains("multi-agent") && err.contains("rae"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opsd_scores_the_branch_after_a_demonstration_hint_with_the_policy() {
    let tmp = tempfile::tempdir().unwrap();
    let model = reverse_text_model().await;
    let address = env_server("reverse-text", serde_json::json!({"num_examples": 20})).await;
    let trainer = fake_trainer(tmp.path(), 1..=1, Duration::ZERO);
    let mut cfg = config(tmp.path(), &model, address, 1);
    let opsd: AlgorithmConfig =
        serde_json::from_value(serde_json::json!({"id": "opsd", "demo_key": "answer", "max_concurrent": 4})).unwrap();
    cfg.algorithms = vec![opsd];
    run(&cfg).await;
    let batch = &trainer.await.unwrap()[0];
    assert_eq!(model.scoring_stats().0, 8, "the policy scored each branch once");
    // Each scored sequence is the hint (the task's answer as a system message) followed by the
    // branch, which starts with the branch's own system prompt.
    for ids in model.scored_prompts() {
        let text: String = ids.iter().map(|&b| b as u8 as char).collect();
        assert!(text.starts_with("<|im_start|>system\nHere is an example of an expert response:"), "{text}");
        assert_eq!(text.matches("<|im_start|>system\n").count(), 2, "{text}");
    }
    let mut checked = 0;
    for mb in &batch.micro_batches {
        for i in (0..mb.input_ids.len()).filter(|&i| mb.loss_mask[i]) {
            let expected = prompt_logprob(mb.input_ids[i]) - TOKEN_LOGPROB;
            assert!((mb.advantages[i] - expected).abs() < 1e-6, "the hint's positions are dropped, not shifted in");
            checked += 1;
        }
    }
    assert!(checked > 50);

    let missing: AlgorithmConfig =
        serde_json::from_value(serde_json::json!({"id": "opsd", "demo_key": "demonstration"})).unwrap();
    cfg.algorithms = vec![missing];
    let mut orch = Orchestrator::connect(&cfg).await.unwrap();
    let err = orch.run(|_| {}).await.unwrap_err().to_string();
    assert!(err.contains("no `demonstration` field") && err.contains("answer"), "{err}");
}

/// The seed's scheduler semantics: a group whose rollouts keep failing with a retryable error is
/// run 3 times, then dropped and counted (`groups_dropped/<kind>`); the step trains the rest.
/// Eval examples that fail are reported, not fatal. Here the model answers 503 to every text of
/// odd length, so those tasks always fail (task choice is seeded: the same tasks every run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_groups_are_dropped_and_counted_and_the_step_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let model = FakeModel::start(|r: &FakeRequest| {
        let text = r.last_user().to_owned();
        if text.chars().count() % 2 == 1 {
            FakeReply::Error(503, String::from("overloaded"))
        } else {
            FakeReply::Text(format!("<reversed_text>{}</reversed_text>", text.chars().rev().collect::<String>()))
        }
    })
    .await;
    let args = serde_json::json!({"num_examples": 40, "test_examples": 6});
    let train = env_server("reverse-text", args.clone()).await;
    let eval_address = env_server("reverse-text", args).await;
    let trainer = fake_trainer(tmp.path(), 1..=2, Duration::ZERO);
    let mut cfg = config(tmp.path(), &model, train, 2);
    cfg.batch_size = 32;
    cfg.max_dropped_group_fraction = 1.0;
    let eval_env = EvalEnvConfig {
        id: String::from("reverse-text"),
        name: None,
        args: Default::default(),
        split: String::from("test"),
        num_examples: Some(6),
        k: None,
        sampling: Default::default(),
        interval: None,
        address: Some(eval_address),
        command: None,
        serve: ServeConfig::default(),
    };
    cfg.eval = Some(EvalConfig { interval: 1, eval_on_start: false, k: 1, env: vec![eval_env], ..Default::default() });
    let summaries = run(&cfg).await;
    trainer.await.unwrap();
    let mut dropped_in_all = 0;
    for s in &summaries {
        let m = row(s);
        let dropped = m.get("groups_dropped/infrastructure").and_then(serde_json::Value::as_u64).unwrap_or(0);
        dropped_in_all += dropped;
        let rollouts = s.metrics.rollouts.as_ref().unwrap();
        assert_eq!(rollouts.rollouts, (8 - dropped) * 4, "{m}");
        // Each run of a dropped group failed on its 4 rollouts, 3 runs each.
        assert_eq!(m.get("errors/infrastructure").and_then(serde_json::Value::as_u64).unwrap_or(0), dropped * 12);
        let eval_dropped = m["eval/reverse-text/dropped"].as_u64().unwrap();
        assert!(eval_dropped < 6, "{m}");
        assert_eq!(m["eval/reverse-text/examples"].as_u64().unwrap(), 6 - eval_dropped);
    }
    assert!(dropped_in_all > 0, "the test's rule made some tasks fail");

    // Past the budget the run stops, naming the cause.
    let tmp = tempfile::tempdir().unwrap();
    let _trainer = fake_trainer(tmp.path(), 1..=1, Duration::ZERO);
    let mut strict = config(tmp.path(), &model, cfg.train.env[0].address.clone().unwrap(), 1);
    strict.batch_size = 32;
    strict.max_dropped_group_fraction = 0.0;
    let mut orch = Orchestrator::connect(&strict).await.unwrap();
    let err = orch.run(|_| {}).await.unwrap_err().to_string();
    assert!(err.contains("max_dropped_group_fraction") && err.contains("overloaded"), "{err}");
}

/// An HTTP endpoint answering its n-th request with `codes[n]` (200 once they run out); counts
/// the requests.
fn scripted_endpoint(codes: Vec<u16>) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = Arc::clone(&count);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let mut stream = stream.unwrap();
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf);
            let n = seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let code = codes.get(n).copied().unwrap_or(200);
            let body = r#"{"status":"ok"}"#;
            let _ = write!(
                stream,
                "HTTP/1.1 {code} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (base, count)
}

/// Weight updates ride out a restarting or overloaded server (5xx answers are retried with
/// backoff, as prime-rl's admin client does) but give up at once on a 4xx.
#[tokio::test]
async fn weight_updates_retry_server_errors_and_not_client_errors() {
    let models = |base: String| {
        let mut cfg = OrchestratorConfig::default();
        cfg.model.base_url = base.into();
        cfg.model.name = Some(String::from("m"));
        rl_orchestrator::Models::new(&cfg).unwrap()
    };
    let (base, count) = scripted_endpoint(vec![503, 502]);
    models(base.clone()).update_weights(&base, Path::new("/tmp/w")).await.expect("the third try succeeds");
    assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 3);
    let (base, count) = scripted_endpoint(vec![400]);
    let err = models(base.clone()).update_weights(&base, Path::new("/tmp/w")).await.unwrap_err().to_string();
    assert!(err.contains("400"), "{err}");
    assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 1, "no retry of a client error");
}

/// An env server that is down for longer than a group's three runs take (the launcher restarts a
/// crashed one after a backoff of up to 32 s): the orchestrator waits for it to answer again
/// before running the failed groups, so the step completes and no group is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_wait_for_an_env_server_that_comes_back_instead_of_being_dropped() {
    let tmp = tempfile::tempdir().unwrap();
    let model = reverse_text_model().await;
    let args = serde_json::json!({"num_examples": 40});
    let env = rl_envs::load("reverse-text", args.as_object().unwrap()).await.unwrap();
    let serve = ServeConfig::default();
    let listener = rl_serve::bind(&serve).await.unwrap();
    let address = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let (env, serve) = (Arc::clone(&env), serve.clone());
        tokio::spawn(async move {
            rl_serve::serve(env, &serve, listener, async {
                let _ = stopped.await;
            })
            .await
        })
    };
    let trainer = fake_trainer(tmp.path(), 1..=1, Duration::ZERO);
    let mut cfg = config(tmp.path(), &model, address.to_string(), 1);
    cfg.wait_for_ready_s = 30.0;
    let mut orch = Orchestrator::connect(&cfg).await.unwrap();
    // The server goes away, and comes back on its address 12 s later (a group's three runs, with
    // the client's own retries, give up after about 7 s).
    stop.send(()).unwrap();
    let _ = first.await;
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(12)).await;
        let again = ServeConfig { port: address.port(), ..ServeConfig::default() };
        let listener = rl_serve::bind(&again).await.unwrap();
        rl_serve::serve(env, &again, listener, std::future::pending()).await
    });
    let mut summaries = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), orch.run(|s| summaries.push(s.clone()))).await.unwrap().unwrap();
    trainer.await.unwrap();
    let m = row(&summaries[0]);
    assert_eq!(m.get("groups_dropped/infrastructure").and_then(serde_json::Value::as_u64).unwrap_or(0), 0, "{m}");
    assert_eq!(summaries[0].metrics.rollouts.as_ref().unwrap().rollouts, 8, "{m}");
}

/// A reward function that fails scores 0 and is recorded; past `max_reward_error_fraction` of a
/// step's rollouts the run stops naming the function and its message (the default never stops).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_reward_functions_stop_the_run_past_their_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let env_file = tmp.path().join("broken.py");
    std::fs::write(
        &env_file,
        "import rl_env\n\
         def load_environment():\n\
         \x20   def exact(completion, answer):\n\
         \x20       if answer.startswith('x'):\n\
         \x20           raise ValueError('no digits in ' + answer)\n\
         \x20       return 1.0\n\
         \x20   rows = [{'question': q, 'answer': q} for q in ['xa', 'b', 'xc', 'd'] * 8]\n\
         \x20   return rl_env.SingleTurnEnv(dataset=rows, rubric=rl_env.Rubric([exact]))\n",
    )
    .unwrap();
    let sdk = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python/rl-env/src");
    let args = serde_json::json!({"file": env_file, "sys_path": [sdk]});
    let train = env_server("python", args).await;
    let model = FakeModel::start(|_: &FakeRequest| FakeReply::Text(String::from("ok"))).await;
    let mut cfg = config(tmp.path(), &model, train, 1);
    cfg.batch_size = 32;
    cfg.max_reward_error_fraction = 0.1;
    let _trainer = fake_trainer(tmp.path(), 1..=1, Duration::ZERO);
    let mut orch = Orchestrator::connect(&cfg).await.unwrap();
    let err = orch.run(|_| {}).await.unwrap_err().to_string();
    assert!(
        err.contains("max_reward_error_fraction") && err.contains("`exact`: ") && err.contains("no digits in x"),
        "{err}"
    );
    // Within the budget (the default: never stop) the step trains, and each trace names its errors.
    let tmp = tempfile::tempdir().unwrap();
    let trainer = fake_trainer(tmp.path(), 1..=1, Duration::ZERO);
    let mut lenient = config(tmp.path(), &model, cfg.train.env[0].address.clone().unwrap(), 1);
    lenient.batch_size = 32;
    run(&lenient).await;
    trainer.await.unwrap();
    let traces = std::fs::read_to_string(rl_run::RunDir::new(tmp.path()).traces(1)).unwrap();
    let named = traces.lines().filter(|l| l.contains(r#""reward_errors":[{"name":"exact""#)).count();
    assert!(named > 0 && traces.lines().all(|l| l.contains("\"reward_errors\"")), "{traces}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_batch_fills_each_step_to_its_token_count_in_rounds() {
    // Replies of uneven length (the seed decides the chatter), so a step's rollout count varies;
    // odd seeds leave the tags out (a group's rewards differ: something trains).
    let model = FakeModel::start(|r: &FakeRequest| {
        let rev: String = r.last_user().chars().rev().collect();
        let seed = r.body["seed"].as_u64().unwrap_or(0);
        let chatter = " more".repeat((seed % 7) as usize);
        FakeReply::Text(if seed.is_multiple_of(2) {
            format!("<reversed_text>{rev}</reversed_text>{chatter}")
        } else {
            rev
        })
    })
    .await;
    let args = serde_json::json!({"num_examples": 200, "min_len": 3, "max_len": 12});
    let tmp = tempfile::tempdir().unwrap();
    let address = env_server("reverse-text", args).await;
    let steps = 3;
    let trainer = fake_trainer(tmp.path(), 1..=steps, Duration::ZERO);
    let mut cfg = config(tmp.path(), &model, address, steps);
    let budget = 2500;
    cfg.token_batch_size = Some(budget);
    let summaries = run(&cfg).await;
    let batches = trainer.await.unwrap();
    let rows: Vec<serde_json::Value> = summaries.iter().map(row).collect();
    for (m, b) in rows.iter().zip(&batches) {
        let tokens = m["token_batch/tokens"].as_u64().unwrap();
        // A first round of 8 rollouts holds far fewer tokens: more rounds follow, then stop.
        assert!(tokens >= budget && m["token_batch/rounds"].as_u64().unwrap() >= 2, "{m}");
        assert!(m["rollouts"].as_u64().unwrap() > 8, "{m}");
        let trained: u64 = b.micro_batches.iter().map(|mb| mb.input_ids.len() as u64).sum();
        assert!(trained <= tokens, "packed rows hold at most the rollouts' tokens: {trained} of {tokens}");
    }
    assert!(batches.iter().any(|b| !b.micro_batches.is_empty()), "groups that teach were trained");
    // Rounds are sized from the tokens a rollout took: a step passes its count by less than the
    // last round's share, not by whole batches.
    assert!(rows.iter().all(|m| m["token_batch/tokens"].as_u64().unwrap() < 2 * budget), "{rows:?}");
    // Refill rounds and a token count both add rounds: one at a time.
    cfg.max_refill_rounds = 2;
    assert!(cfg.validate("").unwrap_err().to_string().contains("token_batch_size"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_per_minute_spaces_group_starts_past_a_minutes_allowance() {
    let model = reverse_text_model().await;
    let args = serde_json::json!({"num_examples": 300, "min_len": 3, "max_len": 8});
    let tmp = tempfile::tempdir().unwrap();
    let address = env_server("reverse-text", args).await;
    let trainer = fake_trainer(tmp.path(), 1..=1, Duration::ZERO);
    let mut cfg = config(tmp.path(), &model, address, 1);
    // 128 groups of one at 120 a minute: 120 start at once, the other 8 half a second apart.
    (cfg.batch_size, cfg.group_size, cfg.tasks_per_minute) = (128, 1, Some(120));
    cfg.train.env[0].group_size = Some(1);
    let started = std::time::Instant::now();
    let summaries = run(&cfg).await;
    let waited = started.elapsed();
    trainer.await.unwrap();
    assert_eq!(row(&summaries[0])["rollouts"], 128);
    assert!(waited >= Duration::from_millis(3500), "the last 8 starts were spaced: {waited:?}");
    assert_eq!(model.requests().len(), 128);
}
