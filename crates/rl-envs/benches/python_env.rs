//! Benchmark: what hosting an environment in Python costs per rollout. The same reverse-text task,
//! built in (Rust) and written with the `rl_env` SDK (Python worker), served side by side against
//! an instant fake model: server time per rollout excluding the model, and rollouts per second.

// The printed table is this benchmark's output.
#![allow(clippy::print_stdout)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rl_configs::ServeConfig;
use rl_serve::fake_model::{FakeModel, FakeReply, FakeRequest};
use rl_serve::{ClientOptions, EnvClient, pb};
use serde_json::{Value, json};

const GROUP: u32 = 8;
const GROUPS_IN_FLIGHT: usize = 16;
const ROUNDS: usize = 8;

async fn serve(id: &str, args: &Value) -> EnvClient {
    let env = rl_envs::load(id, args.as_object().expect("args")).await.expect("load env");
    let config = ServeConfig { max_concurrent: 1024, ..Default::default() };
    let listener = rl_serve::bind(&config).await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { rl_serve::serve(Arc::clone(&env), &config, listener, std::future::pending()).await });
    let client = EnvClient::new(&addr.to_string(), ClientOptions::default()).expect("client");
    client.wait_for_health(Duration::from_secs(30)).await.expect("health");
    client
}

/// (median server time per rollout excluding the model, rollouts per second).
async fn measure(client: &EnvClient, actor: &pb::ModelRuntime, group: u32, in_flight: usize) -> (Duration, f64) {
    let request = |i: usize| pb::RunGroupRequest {
        example: Some(pb::ExampleRef {
            source: Some(pb::example_ref::Source::Dataset(pb::DatasetIndex {
                split: String::from("train"),
                index: i as u64 % 100,
            })),
        }),
        group_size: group,
        actor: Some(actor.clone()),
        training_context: Some(pb::TrainingContext { step: 3, ..Default::default() }),
        ..Default::default()
    };
    let mut own = Vec::new();
    let start = Instant::now();
    for round in 0..ROUNDS {
        let groups = (0..in_flight).map(|g| client.run_group(request(round * in_flight + g)));
        for response in futures::future::join_all(groups).await {
            for episode in response.expect("run_group").episodes {
                let t = &episode.traces[0];
                assert!(t.errors.is_empty() && t.reward_errors.is_empty(), "{t:?}");
                let timing = t.timing.expect("timing");
                own.push(Duration::from_secs_f64((timing.total_s - timing.model_s).max(0.0)));
            }
        }
    }
    let rate = own.len() as f64 / start.elapsed().as_secs_f64();
    own.sort();
    (own[own.len() / 2], rate)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let model = FakeModel::start(|r: &FakeRequest| {
            let reversed: String = r.last_user().chars().rev().collect();
            FakeReply::Text(format!("<reversed_text>{reversed}</reversed_text>"))
        })
        .await;
        let actor = pb::ModelRuntime {
            base_url: model.base_url.clone(),
            model: String::from("fake"),
            tokens: true,
            ..Default::default()
        };
        let sdk = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../python/rl-env");
        let env_args = json!({"num_examples": 100, "format_penalty": 0.1, "penalty_warmup_steps": 10});
        let python_args = json!({
            "file": sdk.join("examples/reverse_text.py"),
            "sys_path": [sdk.join("src")],
            "args": env_args,
        });
        let rust = serve("reverse-text", &env_args).await;
        let python = serve("python", &python_args).await;
        // Warm-up, then interleave the two twice so machine noise hits both.
        measure(&rust, &actor, GROUP, GROUPS_IN_FLIGHT).await;
        measure(&python, &actor, GROUP, GROUPS_IN_FLIGHT).await;
        let mut rows = Vec::new();
        let mut alone = Vec::new();
        for _ in 0..2 {
            rows.push(("rust", measure(&rust, &actor, GROUP, GROUPS_IN_FLIGHT).await));
            rows.push(("python", measure(&python, &actor, GROUP, GROUPS_IN_FLIGHT).await));
            alone.push(("rust", measure(&rust, &actor, 1, 1).await.0));
            alone.push(("python", measure(&python, &actor, 1, 1).await.0));
        }
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "reverse-text, groups of {GROUP}, {GROUPS_IN_FLIGHT} groups in flight, instant fake model, 2 reward functions + 1 metric"
        );
        for (name, (own, rate)) in &rows {
            println!("  {name:>6}: server time per rollout excl. model (median) {:.3} ms, {rate:.0} rollouts/s", ms(*own));
        }
        let best = |n: &str| rows.iter().filter(|r| r.0 == n).map(|r| r.1.0).min().expect("rows");
        let rate = |n: &str| rows.iter().filter(|r| r.0 == n).map(|r| r.1.1).fold(0.0, f64::max);
        let single = |n: &str| alone.iter().filter(|r| r.0 == n).map(|r| r.1).min().expect("rows");
        println!(
            "one rollout at a time: server time excl. model {:.3} ms (rust) vs {:.3} ms (python): +{:.3} ms per rollout",
            ms(single("rust")),
            ms(single("python")),
            ms(single("python").saturating_sub(single("rust")))
        );
        println!(
            "under load: +{:.3} ms median (queueing on the one python process); throughput ratio python/rust {:.2}x",
            ms(best("python").saturating_sub(best("rust"))),
            rate("python") / rate("rust")
        );
    });
}
