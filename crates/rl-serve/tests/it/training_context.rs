//! `training_context` is per request: hundreds of concurrent groups, each scored with its own step,
//! including in child rubrics of a `RubricGroup`; requests without one see none.

use std::sync::Arc;

use rl_configs::ServeConfig;
use rl_serve::{ClientOptions, pb};

use crate::{StepEnv, actor, dataset, echo_model, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_concurrent_request_is_scored_with_its_own_context() {
    let model = echo_model().await;
    let h = start(
        Arc::new(StepEnv::new()),
        ServeConfig { max_concurrent: 64, ..Default::default() },
        ClientOptions::default(),
    )
    .await;
    let requests = (0..240u64).map(|i| {
        let client = h.client.clone();
        let mut actor = actor(&model);
        // Each request samples at its own temperature; its traces must say which.
        let temperature = 0.5 + (i % 7) as f64 * 0.1;
        actor.sampling.as_mut().unwrap().temperature = Some(temperature);
        async move {
            // Every third request carries no context: it must see none, not a neighbour's.
            let context =
                (i % 3 != 0).then(|| pb::TrainingContext { step: 1000 + i, policy_version: i, ..Default::default() });
            let resp = client
                .run_group(pb::RunGroupRequest {
                    example: dataset("train", i % 10),
                    group_size: 2,
                    actor: Some(actor),
                    training_context: context.clone(),
                    ..Default::default()
                })
                .await
                .unwrap();
            (i, context, resp, temperature)
        }
    });
    let results = futures::future::join_all(requests).await;
    for (i, context, resp, temperature) in results {
        assert_eq!(resp.episodes.len(), 2);
        for ep in &resp.episodes {
            let trace = &ep.traces[0];
            assert!(trace.errors.is_empty(), "{:?}", trace.errors);
            let want = context.as_ref().map_or(0.0, |c| c.step as f64);
            assert_eq!(trace.rewards["step"].score, want, "request {i} scored with another request's step");
            assert_eq!(trace.reward, want);
            assert_eq!(trace.metrics["has_context"], f64::from(u8::from(context.is_some())), "request {i}");
            assert_eq!(trace.scored_with, context, "the trace echoes the context it was scored with");
            assert_eq!(trace.sampling_temperature, Some(temperature), "the trace records its sampling temperature");
            assert_eq!(trace.reward_errors.len(), 1, "a failing metric is recorded, not fatal");
            assert_eq!(trace.reward_errors[0].name, "fails");
        }
    }
}
