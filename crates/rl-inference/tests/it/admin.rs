//! Admin endpoints: weight updates (good and bad), pause/resume, models, health.

use std::time::Duration;

use rl_model::{random_weights, read_config, write_safetensors};
use serde_json::json;

use crate::start;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_weights_changes_outputs_and_a_bad_dir_changes_nothing() {
    let srv = start(|_| {}).await;
    let before = srv.greedy("hello there").await;
    let cfg = read_config(&srv.model_dir()).unwrap();
    let new_dir = srv.dir.path().join("broadcast");
    std::fs::create_dir_all(&new_dir).unwrap();
    let weights: Vec<_> =
        random_weights(&cfg, 99).unwrap().into_iter().map(|(n, t)| (n, (t * 20.0).unwrap())).collect();
    write_safetensors(&new_dir.join("model.safetensors"), &weights).unwrap();
    let (s, v) = srv.post("/update_weights", json!({"weight_dir": new_dir})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["version"], 1);
    let after = srv.greedy("hello there").await;
    assert_ne!(before, after, "new weights change the output");

    let (s, v) = srv.post("/update_weights", json!({"weight_dir": srv.dir.path().join("nowhere")})).await;
    assert_eq!(s, 400, "{v}");
    let empty = srv.dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    std::fs::write(empty.join("model.safetensors"), b"garbage").unwrap();
    let (s, _) = srv.post("/update_weights", json!({"weight_dir": empty})).await;
    assert_eq!(s, 400);
    assert_eq!(srv.greedy("hello there").await, after, "a failed update leaves the weights alone");
    let (s, v) = srv
        .post(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 2}),
        )
        .await;
    assert_eq!((s, v["weights_version"].as_u64()), (200, Some(1)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_holds_requests_until_resume() {
    let srv = start(|_| {}).await;
    assert_eq!(srv.post("/pause", json!({})).await.0, 200);
    let url = format!("{}/v1/chat/completions", srv.base);
    let http = srv.http.clone();
    let pending = tokio::spawn(async move {
        http.post(url)
            .json(&json!({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 3}))
            .send()
            .await
            .unwrap()
            .status()
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!pending.is_finished(), "paused servers do not generate");
    assert_eq!(srv.post("/resume", json!({})).await.0, 200);
    let status = tokio::time::timeout(Duration::from_secs(30), pending).await.unwrap().unwrap();
    assert_eq!(status.as_u16(), 200);
}

#[tokio::test]
async fn models_and_health() {
    let srv = start(|_| {}).await;
    let v: serde_json::Value =
        srv.http.get(format!("{}/v1/models", srv.base)).send().await.unwrap().json().await.unwrap();
    assert_eq!(v["data"][0]["id"], "tiny");
    let h = srv.http.get(format!("{}/health", srv.base)).send().await.unwrap();
    assert!(h.status().is_success());
}
