//! The example env served over gRPC against rl-serve's scripted model: right counts score 1.

use std::sync::Arc;
use std::time::Duration;

use rl_serve::fake_model::{FakeModel, FakeReply, FakeRequest};
use rl_serve::{ClientOptions, EnvClient, pb};

#[tokio::test]
async fn right_counts_score_one_and_wrong_counts_zero() {
    let env = Arc::new(word_count_env::WordCount::new(&Default::default()).unwrap());
    let config = rl_serve::bind(&Default::default()).await.unwrap();
    let addr = config.local_addr().unwrap();
    tokio::spawn(async move { rl_serve::serve(env, &Default::default(), config, std::future::pending()).await });
    let client = EnvClient::new(&addr.to_string(), ClientOptions::default()).unwrap();
    client.wait_for_health(Duration::from_secs(10)).await.unwrap();
    let model = FakeModel::start(|r: &FakeRequest| {
        let words = r.last_user().split_whitespace().count();
        let off = usize::from(r.body["seed"].as_u64() == Some(8));
        FakeReply::Text(format!("There are {} words.", words + off))
    })
    .await;
    let actor = pb::ModelRuntime {
        base_url: model.base_url.clone(),
        model: String::from("fake"),
        tokens: true,
        sampling: Some(pb::SamplingArgs { seed: Some(7), ..Default::default() }),
        ..Default::default()
    };
    let example = pb::ExampleRef {
        source: Some(pb::example_ref::Source::Dataset(pb::DatasetIndex { split: String::from("train"), index: 3 })),
    };
    let request =
        pb::RunGroupRequest { example: Some(example), group_size: 2, actor: Some(actor), ..Default::default() };
    let response = client.run_group(request).await.unwrap();
    let rewards: Vec<f64> = response.episodes.iter().map(|e| e.traces[0].reward).collect();
    assert_eq!(rewards, [1.0, 0.0]);
}

#[test]
fn unknown_args_are_rejected_by_name() {
    let args = [(String::from("size"), serde_json::json!(3))].into();
    let err = word_count_env::WordCount::new(&args).err().unwrap().to_string();
    assert!(err.contains("env.args.size"), "{err}");
}
