//! Integration tests of the inference server over HTTP on 127.0.0.1 with a tiny random model.

mod admin;
mod echo;
mod generate;
mod generation;
mod hostile;
mod reasoning;
mod responses;
mod structured;

use candle_core::{Device, Tensor};
use rl_configs::{InferenceConfig, ModelConfig};
use rl_model::{CausalLm, Preset, init_model, load_model};
use serde_json::{Value, json};

pub(crate) struct Srv {
    pub(crate) base: String,
    pub(crate) dir: tempfile::TempDir,
    pub(crate) http: reqwest::Client,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Srv {
    pub(crate) fn model_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("tiny")
    }

    pub(crate) async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let r = self.http.post(format!("{}{path}", self.base)).json(&body).send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Greedy completion ids for a user message.
    pub(crate) async fn greedy(&self, text: &str) -> Vec<u64> {
        let (s, v) = self
            .post(
                "/v1/chat/completions",
                json!({"messages": [{"role": "user", "content": text}], "temperature": 0.0, "max_completion_tokens": 10, "return_token_ids": true}),
            )
            .await;
        assert_eq!(s, 200, "{v}");
        v["choices"][0]["token_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect()
    }
}

pub(crate) async fn start(tweak: impl FnOnce(&mut InferenceConfig)) -> Srv {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny");
    init_model(&model, Preset::Tiny, 0, false).unwrap();
    let mut config =
        InferenceConfig { model: ModelConfig { path: Some(model), name: None }, port: 0, ..Default::default() };
    tweak(&mut config);
    let server = rl_inference::Server::build(&config).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.serve(listener, async {
        let _ = rx.await;
    }));
    Srv { base: format!("http://{addr}"), dir, http: rl_serve::http::client_builder(&[]).build().unwrap(), _stop: tx }
}

/// `log_softmax(logits / t)` of the continuation tokens, recomputed with a full forward pass.
pub(crate) fn recompute(model: &CausalLm, prompt: &[u32], completion: &[u32], t: f32) -> Vec<f32> {
    let ids: Vec<u32> = [prompt, completion].concat();
    let pos: Vec<u32> = (0..ids.len() as u32).collect();
    let logits: Tensor = model.forward_packed(&[ids], &[pos]).unwrap().squeeze(0).unwrap();
    let rows: Vec<Vec<f32>> = logits.to_vec2().unwrap();
    completion
        .iter()
        .enumerate()
        .map(|(k, id)| rl_model::log_softmax(&rows[prompt.len() - 1 + k], t)[*id as usize])
        .collect()
}

pub(crate) fn load(dir: &std::path::Path) -> CausalLm {
    load_model(dir, &Device::Cpu).unwrap()
}

pub(crate) fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}
