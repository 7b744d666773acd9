//! `RunAlgorithms`: env-owned algorithms produce per-branch values checked against branch tokens.

use std::sync::Arc;

use rl_configs::ServeConfig;
use rl_serve::{ClientOptions, branches, pb};

use crate::{StepEnv, actor, dataset, echo_model, start};

#[tokio::test]
async fn rloo_gives_leave_one_out_advantages_on_sampled_tokens() {
    let model = echo_model().await;
    let h = start(Arc::new(StepEnv::new()), ServeConfig::default(), ClientOptions::default()).await;
    let mut traces = Vec::new();
    for step in [1u64, 2, 6] {
        let resp = h
            .client
            .run_group(pb::RunGroupRequest {
                example: dataset("train", 1),
                group_size: 1,
                actor: Some(actor(&model)),
                training_context: Some(pb::TrainingContext { step, ..Default::default() }),
                ..Default::default()
            })
            .await
            .unwrap();
        traces.push(resp.episodes[0].traces[0].clone());
    }
    let info = h.client.info().await.unwrap();
    assert!(info.algorithms.contains(&String::from("rloo")));
    let resp = h
        .client
        .run_algorithms(pb::RunAlgorithmsRequest {
            algorithms: vec![pb::AlgorithmSpec { id: String::from("rloo"), fields_json: String::from("{}") }],
            traces: traces.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    // Rewards 1, 2, 6: A_i = r_i - mean(others) = 1-4, 2-3.5, 6-1.5.
    for (trace, (out, want)) in traces.iter().zip(resp.traces.iter().zip([-3.0f32, -1.5, 4.5])) {
        let b = &branches(trace)[0];
        assert_eq!(out.branches.len(), 1);
        let o = &out.branches[0];
        assert_eq!(o.loss, pb::LossChannel::Rl as i32);
        assert_eq!(o.advantages.len(), b.token_ids.len());
        assert_eq!(o.mask, b.mask);
        for (a, m) in o.advantages.iter().zip(&o.mask) {
            assert_eq!(*a, if *m { want } else { 0.0 });
        }
    }
    let err = h
        .client
        .run_algorithms(pb::RunAlgorithmsRequest {
            algorithms: vec![pb::AlgorithmSpec { id: String::from("nope"), fields_json: String::new() }],
            traces: traces.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(err.to_string().contains("algorithms[0].id"), "{err}");
    // A non-finite reward would turn every advantage of the group into NaN: refused by name.
    let rloo = vec![pb::AlgorithmSpec { id: String::from("rloo"), fields_json: String::from("{}") }];
    for (field, poison) in [("traces[1].reward", f64::NAN), ("traces[1].rewards", f64::INFINITY)] {
        let mut bad = traces.clone();
        if field.ends_with("rewards") {
            bad[1].rewards.insert(String::from("x"), pb::RewardValue { score: poison, weight: 1.0 });
        } else {
            bad[1].reward = poison;
        }
        let req = pb::RunAlgorithmsRequest { algorithms: rloo.clone(), traces: bad, ..Default::default() };
        let err = h.client.run_algorithms(req).await.unwrap_err();
        assert!(err.to_string().contains(field) && err.to_string().contains("finite"), "{err}");
    }
}
