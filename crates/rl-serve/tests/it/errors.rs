//! Malformed requests get INVALID_ARGUMENT naming the field and the server keeps serving; rollout
//! failures are recorded on the trace; a dropped client cancels its rollouts.

use std::sync::Arc;
use std::time::{Duration, Instant};

use prost::Message as _;
use rl_configs::ServeConfig;
use rl_serve::fake_model::{FakeModel, FakeReply, FakeRequest};
use rl_serve::{ClientOptions, EnvClient, Error, pb};

use crate::{StepEnv, actor, dataset, echo_model, start};

fn bad_field(err: Error) -> String {
    match err {
        Error::BadRequest { message, .. } => message,
        other => panic!("expected INVALID_ARGUMENT, got {other}"),
    }
}

#[tokio::test]
async fn malformed_requests_are_invalid_argument_and_the_server_keeps_serving() {
    let model = echo_model().await;
    let config = ServeConfig { max_message_bytes: 4096, ..Default::default() };
    let h = start(Arc::new(StepEnv::new()), config, ClientOptions { retries: 0, ..Default::default() }).await;
    let group = |example, group_size| pb::RunGroupRequest {
        example,
        group_size,
        actor: Some(actor(&model)),
        ..Default::default()
    };

    let e = bad_field(h.client.run_group(group(dataset("validation", 0), 1)).await.unwrap_err());
    assert!(e.contains("example.dataset.split") && e.contains("validation"), "{e}");
    let e = bad_field(h.client.run_group(group(dataset("train", 10), 1)).await.unwrap_err());
    assert!(e.contains("example.dataset.index") && e.contains("out of range"), "{e}");
    let e = bad_field(h.client.run_group(group(dataset("train", 0), 0)).await.unwrap_err());
    assert!(e.contains("group_size"), "{e}");
    let e = bad_field(h.client.run_group(group(None, 1)).await.unwrap_err());
    assert!(e.contains("`example`"), "{e}");
    let mut no_url = group(dataset("train", 0), 1);
    no_url.actor.as_mut().unwrap().base_url = String::from("ftp://x");
    assert!(bad_field(h.client.run_group(no_url.clone()).await.unwrap_err()).contains("actor.base_url"));
    // Nothing that could aim the rollout's requests at another route of the model server.
    for sideways in ["http://127.0.0.1:9/update_weights#", "http://127.0.0.1:9/v1?x=", "http://127.0.0.1:9/admin"] {
        let mut req = no_url.clone();
        req.actor.as_mut().unwrap().base_url = sideways.to_owned();
        assert!(bad_field(h.client.run_group(req).await.unwrap_err()).contains("actor.base_url"), "{sideways}");
    }
    // extra_json cannot override (or fill in) a field the server sets, and temperatures keep the floor.
    for (extra, temperature) in [(r#"{"n": 64}"#, None), (r#"{"temperature": 1e-9}"#, None), ("", Some(1e-9))] {
        let mut req = group(dataset("train", 0), 1);
        let sampling = req.actor.as_mut().unwrap().sampling.get_or_insert_with(Default::default);
        sampling.extra_json = extra.to_owned();
        sampling.temperature = temperature;
        let e = bad_field(h.client.run_group(req).await.unwrap_err());
        let key = if extra.is_empty() { "actor.sampling.temperature" } else { "actor.sampling.extra_json." };
        assert!(e.contains(key), "{extra}: {e}");
    }

    let huge = "x".repeat(6000);
    let big = group(
        Some(pb::ExampleRef { source: Some(pb::example_ref::Source::InlineJson(format!("{{\"q\": \"{huge}\"}}"))) }),
        1,
    );
    assert!(big.encoded_len() > 4096);
    let e = bad_field(h.client.run_group(big).await.unwrap_err());
    assert!(e.contains("max_message_bytes") && e.contains("example.inline_json"), "{e}");
    // A large training context is blamed on itself, not on a field that was not sent.
    let mut big_context = group(dataset("train", 0), 1);
    big_context.training_context =
        Some(pb::TrainingContext { extra: [(String::from("notes"), "y".repeat(6000))].into(), ..Default::default() });
    let e = bad_field(h.client.run_group(big_context).await.unwrap_err());
    assert!(e.contains("`training_context`") && !e.contains("example"), "{e}");

    let bad_trace = pb::Trace {
        nodes: vec![pb::MessageNode {
            parent: -1,
            token_ids: vec![1, 2, 3],
            mask: vec![true, false],
            logprobs: vec![-1.0],
            ..Default::default()
        }],
        ..Default::default()
    };
    let e = bad_field(
        h.client
            .run_algorithms(pb::RunAlgorithmsRequest {
                algorithms: vec![pb::AlgorithmSpec { id: String::from("rloo"), fields_json: String::new() }],
                traces: vec![pb::Trace::default(), bad_trace],
                ..Default::default()
            })
            .await
            .unwrap_err(),
    );
    assert!(e.contains("traces[1].nodes[0].mask"), "{e}");

    let ok = h.client.run_group(group(dataset("train", 3), 2)).await.unwrap();
    assert_eq!(ok.episodes.len(), 2, "the server still serves after bad requests");
}

#[tokio::test]
async fn model_failures_are_recorded_on_the_trace_with_their_kind() {
    let h = start(Arc::new(StepEnv::new()), ServeConfig::default(), ClientOptions::default()).await;
    let down = FakeModel::start(|_: &FakeRequest| FakeReply::Error(503, String::from("overloaded"))).await;
    let long = FakeModel::start(|_: &FakeRequest| {
        FakeReply::Error(400, String::from("This model's maximum context length is 8 tokens"))
    })
    .await;
    for (model, kind, retryable) in
        [(&down, pb::ErrorKind::Infrastructure, true), (&long, pb::ErrorKind::OverlongPrompt, false)]
    {
        let resp = h
            .client
            .run_group(pb::RunGroupRequest {
                example: dataset("train", 0),
                group_size: 1,
                actor: Some(actor(model)),
                ..Default::default()
            })
            .await
            .unwrap();
        let trace = &resp.episodes[0].traces[0];
        assert_eq!(trace.errors.len(), 1, "an error, not an empty trajectory");
        assert_eq!(trace.errors[0].kind, kind as i32, "{:?}", trace.errors[0]);
        assert_eq!(trace.errors[0].retryable, retryable);
        assert_eq!(trace.stop_condition, if retryable { "error" } else { "context_length" });
        assert!(trace.rewards.is_empty(), "errored rollouts are not scored");
    }
    let unreachable = pb::ModelRuntime {
        base_url: String::from("http://127.0.0.1:9/v1"),
        model: String::from("m"),
        ..Default::default()
    };
    let resp = h
        .client
        .run_group(pb::RunGroupRequest {
            example: dataset("train", 0),
            group_size: 1,
            actor: Some(unreachable),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(resp.episodes[0].traces[0].errors[0].kind, pb::ErrorKind::Infrastructure as i32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_client_cancels_its_rollouts() {
    let slow = FakeModel::start(|r: &FakeRequest| {
        if r.last_user().contains("\"q\":0") {
            FakeReply::Delayed(Duration::from_secs(60), Box::new(FakeReply::Text(String::from("late"))))
        } else {
            FakeReply::Text(String::from("quick"))
        }
    })
    .await;
    // One episode at a time: the second request can only run once the first one's slot is freed.
    let config = ServeConfig { max_concurrent: 1, ..Default::default() };
    let h = start(Arc::new(StepEnv::new()), config, ClientOptions::default()).await;
    let impatient = EnvClient::new(
        h.client.address(),
        ClientOptions { timeout: Duration::from_millis(300), retries: 0, ..Default::default() },
    )
    .unwrap();
    let req = |index| pb::RunGroupRequest {
        example: dataset("train", index),
        group_size: 1,
        actor: Some(actor(&slow)),
        ..Default::default()
    };
    assert!(impatient.run_group(req(0)).await.is_err(), "the client gives up");
    let start = Instant::now();
    let resp = tokio::time::timeout(Duration::from_secs(30), h.client.run_group(req(1))).await;
    let resp = resp.expect("the abandoned rollout still holds the only slot: it was not cancelled").unwrap();
    assert_eq!(resp.episodes[0].traces[0].errors, vec![]);
    assert!(start.elapsed() < Duration::from_secs(30));
}

/// With `token_env`, every call but `Health` needs the token (UNAUTHENTICATED otherwise), and the
/// actor's `api_key` and extra headers reach the model endpoint (reserved headers are refused). The test's secrets are two
/// variables cargo sets for every test process.
#[tokio::test]
async fn a_token_guards_the_env_server_and_api_keys_reach_the_model() {
    let model = FakeModel::start(|r: &FakeRequest| {
        let h = |name: &str| r.headers.get(name).cloned().unwrap_or_default();
        FakeReply::Text(format!("{} | {}", h("authorization"), h("x-route")))
    })
    .await;
    let config = ServeConfig { token_env: Some(String::from("CARGO_PKG_NAME")), ..Default::default() };
    let token = Some(rl_serve::ApiKey(env!("CARGO_PKG_NAME").to_owned()));
    let opts = |token| ClientOptions { retries: 0, token, ..Default::default() };
    let h = start(Arc::new(StepEnv::new()), config, opts(token.clone())).await;
    let mut actor = actor(&model);
    actor.api_key = String::from("k-123");
    actor.headers.insert(String::from("X-Route"), String::from("replica-2"));
    let req =
        pb::RunGroupRequest { example: dataset("train", 0), group_size: 1, actor: Some(actor), ..Default::default() };
    let resp = h.client.run_group(req.clone()).await.unwrap();
    let said = &resp.episodes[0].traces[0].nodes.last().unwrap().content;
    assert_eq!(said, "Bearer k-123 | replica-2", "the model saw the key and the extra header");
    let mut reserved = req.clone();
    reserved.actor.as_mut().unwrap().headers.insert(String::from("Authorization"), String::from("x"));
    let e = bad_field(h.client.run_group(reserved).await.unwrap_err());
    assert!(e.contains("actor.headers.Authorization"), "{e}");

    for wrong in [None, Some(rl_serve::ApiKey(String::from("nope")))] {
        let other = EnvClient::new(h.client.address(), opts(wrong)).unwrap();
        other.wait_for_health(Duration::from_secs(5)).await.expect("health needs no token");
        assert!(matches!(other.info().await, Err(Error::Unauthenticated(_))));
        assert!(matches!(other.run_group(req.clone()).await, Err(Error::Unauthenticated(_))));
    }
}

/// A model slower than the runtime's `timeout_s` is a retryable timeout whose message names that
/// limit and its value (not the connect timeout, not another knob).
#[tokio::test]
async fn a_slow_model_times_out_naming_the_limit_that_fired() {
    let slow = FakeModel::start(|_: &FakeRequest| {
        FakeReply::Delayed(Duration::from_secs(5), Box::new(FakeReply::Text(String::from("late"))))
    })
    .await;
    let h = start(Arc::new(StepEnv::new()), ServeConfig::default(), ClientOptions { retries: 0, ..Default::default() })
        .await;
    let mut actor = actor(&slow);
    actor.timeout_s = 0.3;
    let req =
        pb::RunGroupRequest { example: dataset("train", 0), group_size: 1, actor: Some(actor), ..Default::default() };
    let resp = h.client.run_group(req).await.unwrap();
    let e = &resp.episodes[0].traces[0].errors[0];
    assert_eq!((e.kind, e.retryable), (pb::ErrorKind::Timeout as i32, true));
    assert!(e.message.contains("took longer than 300ms (the model's timeout_s)"), "{}", e.message);
}
