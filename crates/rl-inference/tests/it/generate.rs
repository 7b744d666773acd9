//! `/inference/v1/generate` in the shapes vLLM serves and `renderers` reads, and `stop_token_ids`
//! on every route.

use serde_json::{Value, json};

use crate::{Srv, ids, load, recompute, start};

/// The prompt ids of a one-message chat, as the server's own template renders them.
async fn chat_prompt(srv: &Srv, text: &str) -> Vec<u32> {
    let (s, v) = srv.post("/tokenize", json!({"messages": [{"role": "user", "content": text}]})).await;
    assert_eq!(s, 200, "{v}");
    ids(&v["tokens"])
}

/// What `renderers.client.generate` checks of each sampled token: `token_id:<id>` and a number.
fn renderer_logprobs(choice: &Value) -> Vec<f32> {
    let ids = ids(&choice["token_ids"]);
    let content = choice["logprobs"]["content"].as_array().expect("logprobs.content");
    assert_eq!(content.len(), ids.len(), "one logprob entry per sampled token");
    content
        .iter()
        .zip(&ids)
        .map(|(entry, id)| {
            assert_eq!(entry["token"], format!("token_id:{id}"));
            entry["logprob"].as_f64().expect("a numeric logprob") as f32
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_samples_what_chat_samples_from_the_same_tokens() {
    let srv = start(|_| {}).await;
    let model = load(&srv.model_dir());
    let prompt = chat_prompt(&srv, "hello there").await;
    let (s, v) = srv
        .post(
            "/inference/v1/generate",
            json!({"model": "tiny", "token_ids": prompt, "cache_salt": "7", "request_id": "abc",
                   "sampling_params": {"temperature": 0.7, "seed": 11, "max_tokens": 12, "logprobs": 1,
                                       "skip_special_tokens": false, "some_future_knob": 3}}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["request_id"], "abc");
    assert_eq!(ids(&v["prompt_token_ids"]), prompt);
    let choice = &v["choices"][0];
    assert!(["stop", "length"].contains(&choice["finish_reason"].as_str().unwrap()), "{choice}");
    let completion = ids(&choice["token_ids"]);
    let returned = renderer_logprobs(choice);
    assert_eq!(choice["logprobs"]["content"][0]["top_logprobs"].as_array().unwrap().len(), 1);
    let want = recompute(&model, &prompt, &completion, 0.7);
    for (k, (a, b)) in returned.iter().zip(&want).enumerate() {
        assert!((a - b).abs() < 1e-4, "token {k}: server {a}, recomputed {b}");
    }
    // The chat route with the same seed samples the same tokens: one engine path.
    let (s, c) = srv
        .post(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hello there"}], "temperature": 0.7, "seed": 11,
                   "max_tokens": 12, "return_token_ids": true}),
        )
        .await;
    assert_eq!(s, 200, "{c}");
    assert_eq!(ids(&c["choices"][0]["token_ids"]), completion);
    assert_eq!(v["usage"]["prompt_tokens"], prompt.len());
}

#[tokio::test]
async fn stop_token_ids_end_a_completion_on_every_route() {
    let srv = start(|_| {}).await;
    let prompt = chat_prompt(&srv, "abc").await;
    let greedy = |stop: Vec<u32>| json!({"token_ids": prompt, "sampling_params": {"temperature": 0.0, "max_tokens": 16, "ignore_eos": true, "stop_token_ids": stop}});
    let (s, free) = srv.post("/inference/v1/generate", greedy(vec![])).await;
    assert_eq!(s, 200, "{free}");
    let free = ids(&free["choices"][0]["token_ids"]);
    assert_eq!(free.len(), 16, "ignore_eos runs to max_tokens");
    let stop = free[2];
    let first = free.iter().position(|&t| t == stop).unwrap();
    let (s, v) = srv.post("/inference/v1/generate", greedy(vec![stop])).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(ids(&v["choices"][0]["token_ids"]), free[..=first].to_vec(), "ends on the stop token, kept");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert!(v["choices"][0]["logprobs"].is_null(), "no logprobs unless asked for");
    // The OpenAI routes honour it too; the stop token is not part of the text.
    let body = json!({"messages": [{"role": "user", "content": "abc"}], "temperature": 0.0, "max_tokens": 16,
                      "ignore_eos": true, "return_token_ids": true, "stop_token_ids": [stop]});
    let (s, c) = srv.post("/v1/chat/completions", body).await;
    assert_eq!(s, 200, "{c}");
    assert_eq!(ids(&c["choices"][0]["token_ids"]), free[..=first].to_vec());
    assert_eq!(c["choices"][0]["finish_reason"], "stop");
    let (s, d) = srv.post("/detokenize", json!({"tokens": free[..first].to_vec()})).await;
    assert_eq!(s, 200);
    assert_eq!(c["choices"][0]["message"]["content"], d["prompt"]);
    let text = json!({"prompt": prompt, "temperature": 0.0, "max_tokens": 16, "ignore_eos": true,
                      "return_token_ids": true, "stop_token_ids": [stop]});
    let (s, t) = srv.post("/v1/completions", text).await;
    assert_eq!(s, 200, "{t}");
    assert_eq!(ids(&t["choices"][0]["token_ids"]), free[..=first].to_vec());
    // Before min_tokens the stop token cannot be sampled, so the completion runs past it.
    let (s, m) = srv
        .post(
            "/inference/v1/generate",
            json!({"token_ids": prompt, "sampling_params": {"temperature": 0.0, "max_tokens": 16, "ignore_eos": true,
                   "stop_token_ids": [stop], "min_tokens": first + 2}}),
        )
        .await;
    assert_eq!(s, 200, "{m}");
    let m = ids(&m["choices"][0]["token_ids"]);
    assert!(m.len() > first + 1 && !m[..first + 1].contains(&stop), "{m:?}");
}

#[tokio::test]
async fn generate_refuses_what_it_cannot_honour_by_name() {
    let srv = start(|_| {}).await;
    let ok = json!({"temperature": 1.0, "max_tokens": 2});
    let cases = [
        (json!({"sampling_params": ok}), "token_ids"),
        (json!({"token_ids": [1, 2]}), "sampling_params"),
        (json!({"token_ids": [1, 2], "sampling_params": 3}), "sampling_params"),
        (json!({"token_ids": [1, 2], "sampling_params": ok, "features": {"mm_hashes": {}}}), "features"),
        (json!({"token_ids": [1, 2], "sampling_params": ok, "stream": true}), "stream"),
        (json!({"token_ids": [1, 2], "sampling_params": ok, "priority": 3}), "priority"),
        (json!({"token_ids": [], "sampling_params": ok}), "empty"),
        (json!({"token_ids": [1, 99999999], "sampling_params": ok}), "vocabulary"),
        (json!({"token_ids": [1, 2], "sampling_params": {"stop_token_ids": [99999999]}}), "stop_token_ids"),
        (json!({"token_ids": [1, 2], "sampling_params": {"temperature": -1.0}}), "temperature"),
        (json!({"token_ids": [1, 2], "sampling_params": {"max_tokens": 100000000}}), "context length"),
    ];
    for (body, needle) in cases {
        let (s, v) = srv.post("/inference/v1/generate", body.clone()).await;
        assert!((400..500).contains(&s), "{body} -> {s} {v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(needle), "{body}: {message:?} should name {needle:?}");
    }
    let (s, v) =
        srv.post("/inference/v1/generate", json!({"model": "other", "token_ids": [1], "sampling_params": ok})).await;
    assert_eq!(s, 404, "{v}");
    let (s, v) = srv
        .post("/inference/v1/generate", json!({"token_ids": [1, 2], "sampling_params": {"n": 3, "max_tokens": 2}}))
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["choices"].as_array().unwrap().len(), 3);
}
