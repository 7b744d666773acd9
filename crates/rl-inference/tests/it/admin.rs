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
    assert!(v["data"][0]["created"].as_u64().unwrap() > 1_700_000_000, "{v}");
    let get = |path: &str| {
        let url = format!("{}{path}", srv.base);
        let http = srv.http.clone();
        async move { http.get(url).send().await.unwrap().text().await.unwrap() }
    };
    assert!(get("/version").await.contains(env!("CARGO_PKG_VERSION")));
    // /detokenize inverts /tokenize.
    let (_, t) = srv.post("/tokenize", serde_json::json!({"prompt": "hello"})).await;
    let (s, d) = srv.post("/detokenize", serde_json::json!({"tokens": t["tokens"]})).await;
    assert_eq!((s, d["prompt"].as_str()), (200, Some("hello")), "{d}");
    // /metrics counts answered requests and their tokens.
    let before = get("/metrics").await;
    assert!(before.contains("vllm:request_success_total{model_name=\"tiny\"} 0"), "{before}");
    srv.greedy("count me").await;
    let after = get("/metrics").await;
    assert!(after.contains("vllm:request_success_total{model_name=\"tiny\"} 1"), "{after}");
    assert!(after.contains("vllm:generation_tokens_total{model_name=\"tiny\"} 10"), "{after}");
    assert!(after.contains("# TYPE vllm:num_requests_running gauge"), "{after}");
}

/// A weight directory whose file is a FIFO (or anything but a regular file) is refused at once
/// instead of blocking the engine on a read that never ends; generation goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_weights_refuses_what_is_not_a_regular_file() {
    let srv = start(|_| {}).await;
    let fifo_dir = srv.dir.path().join("fifo");
    std::fs::create_dir_all(&fifo_dir).unwrap();
    let made = std::process::Command::new("mkfifo").arg(fifo_dir.join("model.safetensors")).status().unwrap();
    assert!(made.success());
    let answer =
        tokio::time::timeout(Duration::from_secs(20), srv.post("/update_weights", json!({"weight_dir": fifo_dir})))
            .await
            .expect("answered, not blocked on the FIFO");
    assert_eq!(answer.0, 400, "{}", answer.1);
    assert!(answer.1["error"]["message"].as_str().unwrap().contains("not a regular file"), "{}", answer.1);
    assert_eq!(srv.greedy("still serving").await.len(), 10);
}

/// `/health` is 503 while the engine has work but has not finished a step for `stuck_after_s`
/// (here 1 ms, so a long prefill reads as stuck), and 200 again once it is idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reports_an_engine_that_stopped_finishing_steps() {
    let srv = start(|c| c.stuck_after_s = 0.001).await;
    let url = format!("{}/v1/completions", srv.base);
    let http = srv.http.clone();
    let long = tokio::spawn(async move {
        let body = json!({"prompt": "abcdefgh".repeat(120), "max_tokens": 1, "prompt_logprobs": 5, "n": 1});
        http.post(url).json(&body).send().await.unwrap().status().as_u16()
    });
    let mut stuck = None;
    while !long.is_finished() {
        let h = srv.http.get(format!("{}/health", srv.base)).send().await.unwrap();
        if h.status().as_u16() == 503 {
            stuck = Some(h.json::<serde_json::Value>().await.unwrap());
            break;
        }
    }
    let stuck = stuck.expect("a 503 while the long step ran");
    assert!(stuck["error"]["message"].as_str().unwrap().contains("finished no step"), "{stuck}");
    assert_eq!(long.await.unwrap(), 200);
    let h = srv.http.get(format!("{}/health", srv.base)).send().await.unwrap();
    assert_eq!(h.status().as_u16(), 200, "idle again");
}

/// Peak resident memory (VmHWM) of this process, in MiB, after resetting it to the current RSS.
fn peak_mib(reset: bool) -> f64 {
    if reset {
        std::fs::write("/proc/self/clear_refs", "5").unwrap();
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb / 1024.0
}

/// Requests just under the body limit that cannot fit the context are refused before they cost
/// memory: four at once (chat text, and a completion prompt of token ids) raise the peak resident
/// memory by a small multiple of their bodies, not gigabytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_prompts_are_refused_within_a_memory_bound() {
    let srv = start(|_| {}).await;
    let limit = 8 * 1024 * 1024 - 4096;
    let chat =
        serde_json::to_vec(&json!({"messages": [{"role": "user", "content": "é".repeat(limit / 2 - 64)}]})).unwrap();
    let ids = vec![7u32; limit / 2 - 64];
    let completion = serde_json::to_vec(&json!({"prompt": ids})).unwrap();
    assert!(chat.len() < limit && completion.len() < limit, "{} {}", chat.len(), completion.len());
    let before = peak_mib(true);
    let mut calls = Vec::new();
    for (route, body) in [("/v1/chat/completions", &chat), ("/v1/completions", &completion)] {
        for _ in 0..2 {
            let req = srv.http.post(format!("{}{route}", srv.base)).header("content-type", "application/json");
            calls.push(req.body(body.clone()).send());
        }
    }
    for r in futures::future::join_all(calls).await {
        let r = r.unwrap();
        assert_eq!(r.status().as_u16(), 400, "{}", r.text().await.unwrap());
    }
    let grown = peak_mib(false) - before;
    // Measured: ~130 MiB, the client's copies of the bodies included (375 MiB when the bodies
    // went through serde's buffered `flatten`/untagged path).
    assert!(grown < 200.0, "4 oversized requests raised the peak by {grown:.0} MiB");
}

/// With keys configured, every route but `/health` needs the API key and admin routes need the
/// admin key (the API key is refused there). Keys come from environment variables; the test uses
/// two that cargo sets for every test process.
#[tokio::test]
async fn api_and_admin_keys_guard_their_routes() {
    let srv = start(|c| {
        c.api_key_env = Some(String::from("CARGO_PKG_NAME"));
        c.admin_key_env = Some(String::from("CARGO_PKG_VERSION"));
    })
    .await;
    let (api, admin) = (env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"));
    let send = |path: &str, key: Option<&str>| {
        let mut r = srv.http.post(format!("{}{path}", srv.base)).json(&json!({
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "weight_dir": srv.model_dir()
        }));
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        async move { r.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(srv.http.get(format!("{}/health", srv.base)).send().await.unwrap().status().as_u16(), 200);
    assert_eq!(send("/v1/chat/completions", None).await, 401);
    assert_eq!(send("/v1/chat/completions", Some("wrong")).await, 401);
    assert_eq!(send("/v1/chat/completions", Some(api)).await, 200);
    assert_eq!(send("/inference/v1/generate", None).await, 401, "the token route is behind the API key too");
    assert_eq!(send("/update_weights", Some(api)).await, 401, "the API key does not open admin routes");
    assert_eq!(send("/update_weights", Some(admin)).await, 200);
    assert_eq!(send("/pause", None).await, 401);
    let r = srv.http.get(format!("{}/v1/models", srv.base)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "authentication_error", "{v}");

    let missing = rl_configs::InferenceConfig {
        api_key_env: Some(String::from("RL_TEST_SURELY_UNSET_KEY")),
        model: rl_configs::ModelConfig { path: Some(srv.model_dir()), name: None },
        ..Default::default()
    };
    let e = rl_inference::Server::build(&missing).unwrap_err().to_string();
    assert!(e.contains("inference.api_key_env") && e.contains("RL_TEST_SURELY_UNSET_KEY"), "{e}");
}

/// With `weight_roots`, only directories under them load (a symlink out of a root does not count);
/// the answer never says whether the path exists.
#[tokio::test]
async fn update_weights_stays_under_the_weight_roots() {
    let roots = tempfile::tempdir().unwrap();
    let root = roots.path().join("broadcasts");
    let srv = start(|c| c.weight_roots = vec![root.clone()]).await;
    let inside = root.join("step_1");
    std::fs::create_dir_all(&inside).unwrap();
    std::fs::copy(srv.model_dir().join("model.safetensors"), inside.join("model.safetensors")).unwrap();
    let (s, v) = srv.post("/update_weights", json!({"weight_dir": inside})).await;
    assert_eq!(s, 200, "{v}");
    let link = root.join("sideways");
    std::os::unix::fs::symlink(srv.model_dir(), &link).unwrap();
    for outside in [srv.model_dir(), link, root.join("../broadcasts/../x"), std::path::PathBuf::from("/etc")] {
        let (s, v) = srv.post("/update_weights", json!({"weight_dir": outside})).await;
        assert_eq!(s, 400, "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("not a directory under"), "{v}");
    }
}

/// Malformed `/update_weights` bodies get the OpenAI error object (JSON), not axum's plain text.
#[tokio::test]
async fn update_weights_answers_malformed_bodies_with_the_error_object() {
    let srv = start(|_| {}).await;
    for (body, content_type) in
        [("{not json", "application/json"), ("{\"weight_dir\": 3}", "application/json"), ("{}", "text/plain")]
    {
        let r = srv
            .http
            .post(format!("{}/update_weights", srv.base))
            .header("content-type", content_type)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 400, "{body}");
        let v: serde_json::Value = r.json().await.expect("a JSON error body");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{body}: {v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lora_adapter_update_serves_base_plus_adapter_with_the_trainers_logprobs() {
    let srv = start(|_| {}).await;
    let cfg = read_config(&srv.model_dir()).unwrap();
    let lora = rl_model::Lora::from_config(&rl_configs::LoraConfig { rank: 4, ..Default::default() });
    // A trained adapter: B as well as A non-zero, from a fixed seed (candle's `randn` draws from
    // an unseeded generator, and some draws left this tiny model's greedy tokens unchanged).
    let mut adapters = rl_model::init_adapters(&cfg, &lora, 3, &candle_core::Device::Cpu).unwrap();
    let mut rng = rl_model::SplitMix64::new(11);
    for t in adapters.iter_mut().filter(|(n, _)| n.contains("lora_B")).map(|(_, t)| t) {
        let values: Vec<f32> = (0..t.elem_count()).map(|_| (rng.uniform() * 2.0 - 1.0) as f32).collect();
        *t = candle_core::Tensor::from_vec(values, t.dims(), &candle_core::Device::Cpu).unwrap();
    }
    let dir = srv.dir.path().join("broadcasts").join("step_1");
    std::fs::create_dir_all(&dir).unwrap();
    let list: Vec<_> = adapters.clone().into_iter().collect();
    rl_model::write_adapter_files(&dir, &lora, "base", &list).unwrap();
    let prompt = vec![1u32, 40, 50, 60, 70, 2, 33, 12];
    let logprobs = |v: &serde_json::Value| -> Vec<f32> {
        prompt
            .iter()
            .enumerate()
            .skip(1)
            .map(|(k, id)| v["prompt_logprobs"][k][id.to_string()]["logprob"].as_f64().unwrap() as f32)
            .collect()
    };
    let body = json!({"prompt": prompt, "max_tokens": 0, "prompt_logprobs": 0});
    let (s, v) = srv.post("/v1/completions", body.clone()).await;
    assert_eq!(s, 200, "{v}");
    let before = logprobs(&v);
    let (s, v) = srv.post("/update_weights", json!({"weight_dir": dir})).await;
    assert_eq!((s, v["version"].as_u64()), (200, Some(1)), "{v}");
    let (s, v) = srv.post("/v1/completions", body).await;
    assert_eq!(s, 200, "{v}");
    let got = logprobs(&v);
    assert!(before.iter().zip(&got).any(|(b, g)| (b - g).abs() > 1e-3), "the adapter changes the output: {got:?}");
    // The trainer's function: the base carrying the adapters, unmerged.
    let base = rl_model::read_weights(&srv.model_dir(), &candle_core::Device::Cpu).unwrap();
    let trainer = rl_model::Trainable::with_adapters(&cfg, base, &lora, &adapters).unwrap();
    let model = trainer.model(&cfg, &candle_core::Device::Cpu).unwrap();
    let want = crate::recompute(&model, &prompt[..1], &prompt[1..], 1.0);
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!((g - w).abs() < 1e-4, "token {}: {g} vs {w}", k + 1);
    }
    // The adapter directory served as the model (as PEFT's AutoPeftModelForCausalLM loads one):
    // the base it names carrying the adapters, the same logprobs as the update above.
    let served = srv.dir.path().join("adapter");
    std::fs::create_dir_all(&served).unwrap();
    rl_model::write_adapter_files(&served, &lora, srv.model_dir().to_str().unwrap(), &list).unwrap();
    let direct = start(|c| c.model.path = Some(served.clone())).await;
    let (s, v) = direct.post("/v1/completions", json!({"prompt": prompt, "max_tokens": 0, "prompt_logprobs": 0})).await;
    assert_eq!(s, 200, "{v}");
    for (k, (d, g)) in logprobs(&v).iter().zip(&got).enumerate() {
        assert!((d - g).abs() < 1e-5, "token {}: served from the adapter directory {d}, updated {g}", k + 1);
    }
    // An adapter of another architecture is refused by name and changes nothing.
    let wrong = srv.dir.path().join("wrong");
    std::fs::create_dir_all(&wrong).unwrap();
    let other = rl_model::Lora::from_config(&rl_configs::LoraConfig { rank: 2, ..Default::default() });
    let bad: Vec<_> = list.iter().filter(|(n, _)| n.contains("q_proj")).cloned().collect();
    rl_model::write_adapter_files(&wrong, &other, "base", &bad).unwrap();
    let (s, v) = srv.post("/update_weights", json!({"weight_dir": wrong})).await;
    assert_eq!(s, 400, "{v}");
    assert!(v.to_string().contains("adapter"), "{v}");
}
