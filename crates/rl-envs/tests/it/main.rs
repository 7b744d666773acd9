//! Integration tests of the built-in environments served over gRPC against a scripted model:
//! token ids, masks and logprobs carried into traces; rewards; the step-aware format penalty.

mod alphabet_sort;
mod dataset;
mod python;
mod reverse_text;
mod wiki_nav;

use std::sync::Arc;
use std::time::Duration;

use rl_configs::ServeConfig;
use rl_serve::fake_model::FakeModel;
use rl_serve::{ClientOptions, EnvClient, pb};
use serde_json::Value;

pub(crate) struct Harness {
    pub(crate) client: EnvClient,
    _stop: tokio::sync::oneshot::Sender<()>,
}

pub(crate) async fn serve(id: &str, args: Value) -> Harness {
    let env = rl_envs::load(id, args.as_object().expect("args table")).await.expect("load env");
    let config = ServeConfig::default();
    let listener = rl_serve::bind(&config).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let _ = rl_serve::serve(Arc::clone(&env), &config, listener, async {
            let _ = rx.await;
        })
        .await;
    });
    let client = EnvClient::new(&addr.to_string(), ClientOptions::default()).unwrap();
    client.wait_for_health(Duration::from_secs(10)).await.unwrap();
    Harness { client, _stop: tx }
}

pub(crate) fn actor(model: &FakeModel, salt: &str) -> pb::ModelRuntime {
    pb::ModelRuntime {
        base_url: model.base_url.clone(),
        model: String::from("fake"),
        tokens: true,
        cache_salt: salt.to_owned(),
        sampling: Some(pb::SamplingArgs {
            temperature: Some(0.8),
            max_completion_tokens: Some(200),
            seed: Some(7),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(crate) fn example(split: &str, index: u64) -> Option<pb::ExampleRef> {
    Some(pb::ExampleRef {
        source: Some(pb::example_ref::Source::Dataset(pb::DatasetIndex { split: split.to_owned(), index })),
    })
}

/// Bytes of a string as the fake model's token ids.
pub(crate) fn ids(s: &str) -> Vec<u32> {
    s.bytes().map(u32::from).collect()
}
