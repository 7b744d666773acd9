//! Benchmark: rollouts per second through `RunGroup` over loopback against an instant fake model,
//! and the latency the env server adds per rollout at 64 requests in flight (target: < 1 ms median).

// The printed table is this benchmark's output.
#![allow(clippy::print_stdout)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rl_configs::ServeConfig;
use rl_serve::fake_model::{FakeModel, FakeReply, FakeRequest};
use rl_serve::{
    ClientOptions, EnvClient, EnvReply, Environment, Message, ModelClient, ModelRuntime, Result, Rubric, RubricGroup,
    ScoringContext, State, Task, pb, reward_fn,
};
use serde_json::{Value, json};

const IN_FLIGHT: usize = 64;
const PER_WORKER: usize = 40;

struct Echo(RubricGroup);

#[async_trait]
impl Environment for Echo {
    fn id(&self) -> &str {
        "echo"
    }
    fn splits(&self) -> Vec<(String, u64)> {
        vec![(String::from("train"), 1)]
    }
    fn task(&self, _: &str, _: u64) -> Result<Task> {
        Ok(Task { key: String::from("train/0"), data: json!({"text": "hello"}) })
    }
    fn inline_task(&self, data: Value) -> Result<Task> {
        Ok(Task { key: String::from("inline"), data })
    }
    async fn prompt(&self, _: &Task) -> Result<Vec<Message>> {
        Ok(vec![Message::system("Reverse the text."), Message::user("hello")])
    }
    async fn env_response(&self, _: &Task, _: &mut State) -> Result<EnvReply> {
        Ok(EnvReply::Done)
    }
    fn rubric(&self) -> &RubricGroup {
        &self.0
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

async fn timed<F, Fut>(in_flight: usize, f: F) -> (Vec<Duration>, Vec<Duration>, Duration)
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Duration> + Send,
{
    let start = Instant::now();
    let workers: Vec<_> = (0..in_flight)
        .map(|_| {
            let f = f.clone();
            tokio::spawn(async move {
                let mut lat = Vec::with_capacity(PER_WORKER);
                let mut own = Vec::with_capacity(PER_WORKER);
                for _ in 0..PER_WORKER {
                    let t = Instant::now();
                    own.push(f().await);
                    lat.push(t.elapsed());
                }
                (lat, own)
            })
        })
        .collect();
    let (mut all, mut owns) = (Vec::new(), Vec::new());
    for w in workers {
        let (lat, own) = w.await.expect("worker");
        all.extend(lat);
        owns.extend(own);
    }
    (all, owns, start.elapsed())
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let model = FakeModel::start(|_: &FakeRequest| FakeReply::Text(String::from("<reversed_text>olleh</reversed_text>"))).await;
        let rubric = RubricGroup::new(vec![Rubric::new().reward(reward_fn("r", |c: &ScoringContext<'_>| Ok(c.last_reply().len() as f64)), 1.0)]);
        let config = ServeConfig { max_concurrent: 1024, ..Default::default() };
        let listener = rl_serve::bind(&config).await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let env: Arc<dyn Environment> = Arc::new(Echo(rubric));
        tokio::spawn(async move { rl_serve::serve(env, &config, listener, std::future::pending()).await });
        let client = EnvClient::new(&addr.to_string(), ClientOptions::default()).expect("client");
        client.wait_for_health(Duration::from_secs(10)).await.expect("health");

        let runtime = pb::ModelRuntime { base_url: model.base_url.clone(), model: String::from("fake"), tokens: true, ..Default::default() };
        let direct = ModelClient::new();
        let rt_domain = ModelRuntime::from_wire(&runtime, "actor").expect("runtime");
        let msgs = vec![Message::system("Reverse the text."), Message::user("hello")];
        // Warm up connections.
        for _ in 0..3 {
            let _ = direct.chat(&rt_domain, &msgs, &[], None, 1, None).await;
        }
        let direct_call = {
            let (direct, rt_domain, msgs) = (direct.clone(), rt_domain.clone(), msgs.clone());
            move || {
                let (direct, rt_domain, msgs) = (direct.clone(), rt_domain.clone(), msgs.clone());
                async move {
                    direct.chat(&rt_domain, &msgs, &[], None, 1, None).await.expect("model call");
                    Duration::ZERO
                }
            }
        };
        let (model_lat, _, _) = timed(IN_FLIGHT, direct_call.clone()).await;
        let (model_lat_1, _, _) = timed(1, direct_call).await;
        let request = pb::RunGroupRequest {
            example: Some(pb::ExampleRef { source: Some(pb::example_ref::Source::Dataset(pb::DatasetIndex { split: String::from("train"), index: 0 })) }),
            group_size: 1,
            actor: Some(runtime.clone()),
            training_context: Some(pb::TrainingContext { step: 1, ..Default::default() }),
            ..Default::default()
        };
        // Each call returns the server's own time for the rollout: its total minus the model call.
        let rollout_call = {
            let (client, request) = (client.clone(), request.clone());
            move || {
                let (client, request) = (client.clone(), request.clone());
                async move {
                    let r = client.run_group(request).await.expect("run_group");
                    let t = &r.episodes[0].traces[0];
                    assert!(t.errors.is_empty());
                    let timing = t.timing.expect("timing");
                    Duration::from_secs_f64((timing.total_s - timing.model_s).max(0.0))
                }
            }
        };
        let (rollout_lat, server_own, wall) = timed(IN_FLIGHT, rollout_call.clone()).await;
        let (rollout_lat_1, _, _) = timed(1, rollout_call).await;
        let n = rollout_lat.len();
        let (m_model, m_rollout) = (median(model_lat), median(rollout_lat));
        let added_1 = median(rollout_lat_1).saturating_sub(median(model_lat_1));
        let own = median(server_own);
        let group8 = pb::RunGroupRequest { group_size: 8, ..request };
        let start = Instant::now();
        let groups = futures::future::join_all((0..64).map(|_| client.run_group(group8.clone()))).await;
        let g_wall = start.elapsed();
        assert!(groups.iter().all(Result::is_ok));
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!("RunGroup throughput (group 1, {IN_FLIGHT} in flight)  {:.0} rollouts/s", n as f64 / wall.as_secs_f64());
        println!("RunGroup throughput (group 8, 64 groups)        {:.0} rollouts/s", 512.0 / g_wall.as_secs_f64());
        let verdict = if own < Duration::from_millis(1) { "meets" } else { "MISSES" };
        println!("server time per rollout, excl. model (median, {IN_FLIGHT} in flight)  {:.3} ms  {verdict} target < 1 ms", ms(own));
        println!("added end-to-end latency, 1 in flight (median)  {:.3} ms (gRPC round trip + server)", ms(added_1));
        println!(
            "median latency at {IN_FLIGHT} in flight: direct model call {:.3} ms, via env server {:.3} ms (client, server and model share the cores: mostly queueing)",
            ms(m_model),
            ms(m_rollout)
        );
    });
}
