//! Contract test of our clients against a server that answers exactly as vLLM's OpenAI server
//! does (the field names, nulls and nesting of vLLM's pydantic models as serialized by its
//! `JSONResponse(model_dump())`, its error object `{"error": {message, type, param, code}}`, an
//! empty `/health` body, FastAPI's `{"detail": "Not Found"}` for routes it lacks), so a drift in
//! what we send or read shows up here rather than against a GPU. The shapes follow vLLM's
//! `chat_completion/protocol.py`, `completion/protocol.py` and `engine/protocol.py`
//! (`ChatCompletionResponse`, `CompletionResponse`, `TokenizeResponse`, `ErrorResponse`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use rl_configs::OrchestratorConfig;
use rl_orchestrator::Models;
use rl_serve::{ApiKey, Message, ModelClient, ModelRuntime, Sampling, ToolSpec};
use serde_json::{Value, json};

/// What a request to the fake carried.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    headers: BTreeMap<String, String>,
    body: Value,
}

#[derive(Clone)]
struct Fake {
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Serve `/update_weights` as `python -m rl_env.vllm_server` does (plain vLLM lacks it).
    with_update_route: bool,
    /// Serve `/v1/load_lora_adapter`, as vLLM does when started with
    /// `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True --enable-lora`.
    with_lora_route: bool,
    /// Adapters loaded through the LoRA API, by name.
    loras: Arc<Mutex<BTreeMap<String, String>>>,
}

impl Fake {
    fn record(&self, path: &str, headers: &HeaderMap, body: &Value) {
        let headers =
            headers.iter().map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned())).collect();
        self.seen.lock().unwrap().push(Seen { path: path.to_owned(), headers, body: body.clone() });
    }
}

/// vLLM's error object (`ErrorResponse` with an `ErrorInfo`).
fn vllm_error(status: StatusCode, kind: &str, message: &str, param: Option<&str>) -> Response {
    (status, axum::Json(json!({"error": {"message": message, "type": kind, "param": param, "code": status.as_u16()}})))
        .into_response()
}

/// One `ChatCompletionLogProbsContent` entry.
fn logprob_entry(token: &str, logprob: f64) -> Value {
    json!({"token": token, "logprob": logprob, "bytes": token.bytes().collect::<Vec<u8>>(), "top_logprobs": []})
}

/// A `ChatCompletionResponseChoice` as vLLM serialises it (every optional field present, null).
fn choice(index: usize, message: &Value, tokens: &[(u32, &str, f64)], finish: &str) -> Value {
    json!({
        "index": index,
        "message": message,
        "logprobs": {"content": tokens.iter().map(|(_, t, l)| logprob_entry(t, *l)).collect::<Vec<_>>()},
        "finish_reason": finish,
        "stop_reason": null,
        "token_ids": tokens.iter().map(|(id, _, _)| id).collect::<Vec<_>>(),
        "routed_experts": null,
    })
}

/// The assistant `ChatMessage` (vLLM drops `tool_calls` when empty, keeps the other nulls).
fn message(content: Option<&str>, tool_calls: Option<Value>) -> Value {
    let mut m = json!({
        "role": "assistant", "content": content, "refusal": null, "annotations": null, "audio": null,
        "function_call": null, "reasoning": null,
    });
    if let Some(calls) = tool_calls {
        m["tool_calls"] = calls;
    }
    m
}

async fn chat(State(fake): State<Fake>, headers: HeaderMap, axum::Json(body): axum::Json<Value>) -> Response {
    fake.record("/v1/chat/completions", &headers, &body);
    let last = body["messages"].as_array().and_then(|m| m.last()).and_then(|m| m["content"].as_str()).unwrap_or("");
    match last {
        "too long" => {
            return vllm_error(
                StatusCode::BAD_REQUEST,
                "BadRequestError",
                "This model's maximum context length is 64 tokens. However, your request has 3000 input tokens. \
                 Please reduce the length of the input messages.",
                None,
            );
        }
        "bad temperature" => {
            return vllm_error(
                StatusCode::BAD_REQUEST,
                "BadRequestError",
                "temperature must be non-negative, got -1.0.",
                Some("temperature"),
            );
        }
        "overloaded" => {
            return vllm_error(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailableError", "engine is busy", None);
        }
        _ => {}
    }
    let model = body["model"].as_str().unwrap_or("");
    if model != "policy" && !fake.loras.lock().unwrap().contains_key(model) {
        let msg = format!("The model `{}` does not exist.", body["model"].as_str().unwrap_or(""));
        return vllm_error(StatusCode::NOT_FOUND, "NotFoundError", &msg, Some("model"));
    }
    // Choice 0: text ending in the end-of-turn token (in `token_ids` and `logprobs`, not in
    // `content`). Choice 1: a hermes-parsed tool call (`content` null).
    let text = choice(
        0,
        &message(Some("olleh"), None),
        &[(7, "ol", -0.25), (8, "leh", -0.5), (2, "<|im_end|>", -0.01)],
        "stop",
    );
    let call = json!([{"id": "chatcmpl-tool-5b1e", "type": "function",
                       "function": {"name": "reverse", "arguments": "{\"text\": \"hello\"}"}}]);
    let tool = choice(
        1,
        &message(None, Some(call)),
        &[(9, "<tool_call>", -1.0), (10, "{...}", -0.125), (11, "</tool_call>", -0.0625)],
        "tool_calls",
    );
    axum::Json(json!({
        "id": "chatcmpl-0d3c2a", "object": "chat.completion", "created": 1_764_000_000, "model": "policy",
        "choices": [text, tool], "service_tier": null, "system_fingerprint": null,
        "usage": {"prompt_tokens": 5, "total_tokens": 11, "completion_tokens": 6, "prompt_tokens_details": null},
        "prompt_logprobs": null, "prompt_token_ids": [1, 3, 4, 5, 6], "prompt_text": null,
        "kv_transfer_params": null, "ec_transfer_params": null, "metrics": null,
    }))
    .into_response()
}

/// `/v1/completions` with `prompt_logprobs`: `choices[0].prompt_logprobs` is a list with `null`
/// first and then one `{token id: Logprob}` map per prompt token.
async fn completions(State(fake): State<Fake>, headers: HeaderMap, axum::Json(body): axum::Json<Value>) -> Response {
    fake.record("/v1/completions", &headers, &body);
    let ids: Vec<u64> =
        body["prompt"].as_array().map(|a| a.iter().filter_map(Value::as_u64).collect()).unwrap_or_default();
    let mut prompt_logprobs = vec![Value::Null];
    for (i, id) in ids.iter().enumerate().skip(1) {
        let lp = -0.5 * i as f64;
        prompt_logprobs.push(json!({id.to_string(): {"logprob": lp, "rank": 3, "decoded_token": "x"}}));
    }
    axum::Json(json!({
        "id": "cmpl-77a1", "object": "text_completion", "created": 1_764_000_000, "model": "policy",
        "choices": [{"index": 0, "text": "y", "logprobs": null, "finish_reason": "length", "stop_reason": null,
                     "token_ids": null, "prompt_logprobs": prompt_logprobs, "prompt_token_ids": null}],
        "service_tier": null, "system_fingerprint": null,
        "usage": {"prompt_tokens": ids.len(), "total_tokens": ids.len() + 1, "completion_tokens": 1, "prompt_tokens_details": null},
        "kv_transfer_params": null,
    }))
    .into_response()
}

async fn tokenize(State(fake): State<Fake>, headers: HeaderMap, axum::Json(body): axum::Json<Value>) -> Response {
    fake.record("/tokenize", &headers, &body);
    axum::Json(json!({"count": 3, "max_model_len": 4096, "tokens": [11, 12, 13], "token_strs": null})).into_response()
}

async fn update_weights(State(fake): State<Fake>, headers: HeaderMap, axum::Json(body): axum::Json<Value>) -> Response {
    fake.record("/update_weights", &headers, &body);
    if !fake.with_update_route {
        return (StatusCode::NOT_FOUND, axum::Json(json!({"detail": "Not Found"}))).into_response();
    }
    axum::Json(json!({"status": "ok"})).into_response()
}

/// `/v1/load_lora_adapter` as vLLM's `OpenAIServingModels` answers it: both fields required, a
/// name already loaded refused unless `load_inplace`, a path without an adapter a 404, success a
/// plain-text sentence.
async fn load_lora_adapter(
    State(fake): State<Fake>,
    headers: HeaderMap,
    axum::Json(body): axum::Json<Value>,
) -> Response {
    fake.record("/v1/load_lora_adapter", &headers, &body);
    if !fake.with_lora_route {
        return (StatusCode::NOT_FOUND, axum::Json(json!({"detail": "Not Found"}))).into_response();
    }
    let (Some(name), Some(path)) = (body["lora_name"].as_str(), body["lora_path"].as_str()) else {
        let msg = "Both 'lora_name' and 'lora_path' must be provided.";
        return vllm_error(StatusCode::BAD_REQUEST, "InvalidUserInput", msg, None);
    };
    let mut loras = fake.loras.lock().unwrap();
    if loras.contains_key(name) && body["load_inplace"] != json!(true) {
        let msg = format!(
            "The lora adapter '{name}' has already been loaded. If you want to load the adapter in place, set \
             'load_inplace' to True."
        );
        return vllm_error(StatusCode::BAD_REQUEST, "InvalidUserInput", &msg, None);
    }
    if !std::path::Path::new(path).join("adapter_config.json").is_file() {
        let msg = format!("Loading lora {name} failed: No adapter found for {path}");
        return vllm_error(StatusCode::NOT_FOUND, "NotFoundError", &msg, None);
    }
    loras.insert(name.to_owned(), path.to_owned());
    format!("Success: LoRA adapter '{name}' added successfully.").into_response()
}

/// A fake vLLM on 127.0.0.1; returns its `/v1` base URL and what it saw.
async fn start(with_update_route: bool) -> (String, Arc<Mutex<Vec<Seen>>>) {
    start_with(with_update_route, false).await
}

/// A fake vLLM, with or without its runtime LoRA route.
async fn start_with(with_update_route: bool, with_lora_route: bool) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let fake = Fake { seen: Arc::clone(&seen), with_update_route, with_lora_route, loras: Arc::default() };
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/tokenize", post(tokenize))
        // vLLM's `/health` answers 200 with an empty body.
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/update_weights", post(update_weights))
        .route("/v1/load_lora_adapter", post(load_lora_adapter))
        .with_state(fake);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}/v1"), seen)
}

fn runtime(base_url: &str, model: &str) -> ModelRuntime {
    ModelRuntime {
        base_url: base_url.to_owned(),
        model: model.to_owned(),
        sampling: Sampling {
            temperature: Some(rl_configs::Temperature::new(0.7).unwrap()),
            max_completion_tokens: Some(16),
            ..Sampling::default()
        },
        tokens: true,
        cache_salt: Some(String::from("4")),
        timeout: Duration::from_secs(10),
        api_key: Some(ApiKey(String::from("sk-test"))),
        headers: BTreeMap::from([(String::from("x-route"), String::from("a"))]),
    }
}

fn models(base_url: &str) -> Models {
    models_with_lora(base_url, None)
}

fn models_with_lora(base_url: &str, lora_name: Option<&str>) -> Models {
    let mut cfg = OrchestratorConfig::default();
    cfg.model.base_url = base_url.into();
    cfg.model.name = Some(String::from("policy"));
    cfg.model.lora_name = lora_name.map(str::to_owned);
    Models::new(&cfg).unwrap()
}

#[tokio::test]
async fn chat_requests_carry_what_training_needs_and_vllm_answers_parse() {
    let (url, seen) = start(true).await;
    let tools = [ToolSpec {
        name: String::from("reverse"),
        description: String::from("Reverses text."),
        parameters: json!({"type": "object", "properties": {"text": {"type": "string"}}}),
    }];
    let reply = ModelClient::new()
        .chat(&runtime(&url, "policy"), &[Message::user("hello")], &tools, Some(9), 2, Some("rollout-3"))
        .await
        .unwrap();

    // What vLLM needs to hand back tokens and logprobs of the processed distribution.
    let req = seen.lock().unwrap()[0].clone();
    assert_eq!(req.path, "/v1/chat/completions");
    for (key, want) in [
        ("model", json!("policy")),
        ("n", json!(2)),
        ("temperature", json!(0.7)),
        ("max_completion_tokens", json!(16)),
        ("seed", json!(9)),
        ("logprobs", json!(true)),
        ("return_token_ids", json!(true)),
        ("cache_salt", json!("4")),
        // Stated, so vLLM's `--generation-config auto` cannot fill them from the model's defaults.
        ("top_k", json!(-1)),
        ("min_p", json!(0.0)),
        ("repetition_penalty", json!(1.0)),
    ] {
        assert_eq!(req.body[key], want, "request field {key}");
    }
    assert_eq!(req.body["tools"][0]["function"]["name"], "reverse");
    assert_eq!(req.body["messages"][0], json!({"role": "user", "content": "hello"}));
    assert_eq!(req.headers["authorization"], "Bearer sk-test");
    assert_eq!(req.headers["x-session-id"], "rollout-3");
    assert_eq!(req.headers["x-route"], "a");

    // The answer: prompt ids, per-choice ids and logprobs (end-of-turn token included), tool calls.
    assert_eq!(reply.prompt_token_ids, Some(vec![1, 3, 4, 5, 6]));
    let (text, tool) = (&reply.choices[0], &reply.choices[1]);
    assert_eq!(text.message.content, "olleh");
    assert_eq!(text.token_ids, Some(vec![7, 8, 2]));
    assert_eq!(text.logprobs, Some(vec![-0.25, -0.5, -0.01]));
    assert_eq!(text.finish_reason, "stop");
    assert_eq!(tool.finish_reason, "tool_calls");
    assert_eq!(tool.message.content, "");
    assert_eq!(tool.message.tool_calls.len(), 1);
    assert_eq!(tool.message.tool_calls[0].name, "reverse");
    assert_eq!(tool.message.tool_calls[0].id, "chatcmpl-tool-5b1e");
    assert_eq!(tool.token_ids, Some(vec![9, 10, 11]));
}

#[tokio::test]
async fn vllm_errors_map_to_the_error_kinds_the_scheduler_acts_on() {
    let (url, _) = start(true).await;
    let client = ModelClient::new();
    let ask = |text: &'static str, model: &'static str| {
        let (client, url) = (client.clone(), url.clone());
        async move { client.chat(&runtime(&url, model), &[Message::user(text)], &[], None, 1, None).await.unwrap_err() }
    };
    // Context overflow: kept as `prompt_too_long`, not retried.
    let e = ask("too long", "policy").await;
    assert!(matches!(e, rl_serve::Error::OverlongPrompt(_)), "{e:?}");
    // A rejected parameter: a bad request naming vLLM's message.
    let e = ask("bad temperature", "policy").await;
    assert!(matches!(&e, rl_serve::Error::BadRequest { .. }) && e.to_string().contains("temperature"), "{e:?}");
    // An unknown model name: a bad request carrying vLLM's message (which names the model).
    let e = ask("hi", "polcy").await;
    assert!(e.to_string().contains("The model `polcy` does not exist"), "{e}");
    // Overload: retryable infrastructure error.
    let e = ask("overloaded", "policy").await;
    assert!(matches!(e, rl_serve::Error::Infrastructure(_)), "{e:?}");
}

#[tokio::test]
async fn scoring_tokenize_and_health_read_vllm_shapes() {
    let (url, seen) = start(true).await;
    let m = models(&url);
    m.wait_healthy("policy", Duration::from_secs(5)).await.unwrap();
    assert_eq!(m.policy_health(&url).await.as_deref(), Some(""), "vLLM's /health has no body");
    let lps = m.score("policy", &[5, 6, 7], Some(2), None).await.unwrap();
    assert_eq!(lps, vec![0.0, -0.5, -1.0]);
    let req = seen.lock().unwrap().iter().find(|s| s.path == "/v1/completions").cloned().unwrap();
    assert_eq!(req.body["prompt"], json!([5, 6, 7]));
    assert_eq!(req.body["prompt_logprobs"], json!(0));
    assert_eq!(req.body["cache_salt"], json!("2"));
    let ids = m.tokenize("policy", json!([{"role": "user", "content": "hi"}])).await.unwrap();
    assert_eq!(ids, vec![11, 12, 13]);
    let req = seen.lock().unwrap().iter().find(|s| s.path == "/tokenize").cloned().unwrap();
    assert_eq!(req.body["add_generation_prompt"], json!(false));
}

#[tokio::test]
async fn weight_updates_use_the_rl_env_vllm_server_route_and_plain_vllm_says_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let (url, seen) = start(true).await;
    models(&url).update_weights(&url, dir.path()).await.unwrap();
    let req = seen.lock().unwrap().iter().find(|s| s.path == "/update_weights").cloned().unwrap();
    let sent = std::path::PathBuf::from(req.body["weight_dir"].as_str().unwrap());
    assert!(sent.is_absolute() && sent == std::path::absolute(dir.path()).unwrap(), "{sent:?}");

    // Plain `vllm serve` has no such route: the error says so and what to run instead (and a
    // 404 is not retried).
    let (plain, _) = start(false).await;
    let e = models(&plain).update_weights(&plain, dir.path()).await.unwrap_err().to_string();
    assert!(e.contains("404") && e.contains("rl_env.vllm_server"), "{e}");
}

#[tokio::test]
async fn lora_adapters_load_through_vllms_lora_api_and_requests_name_the_adapter_once_loaded() {
    let (url, seen) = start_with(true, true).await;
    let m = models_with_lora(&url, Some("policy-lora"));
    let policy = m.endpoint("policy").unwrap();
    // Step 0 samples the base (no adapter is loaded yet); every later version names the adapter.
    assert_eq!(policy.model_at(0), "policy");
    assert_eq!(policy.model_at(3), "policy-lora");

    let broadcasts = tempfile::tempdir().unwrap();
    for step in 1..=2 {
        let dir = broadcasts.path().join(format!("step_{step}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("adapter_config.json"), "{}").unwrap();
        // The second load replaces the first under the same name (vLLM refuses it without
        // `load_inplace`).
        m.update_weights(&url, &dir).await.unwrap();
    }
    let loads: Vec<Seen> = seen.lock().unwrap().iter().filter(|s| s.path == "/v1/load_lora_adapter").cloned().collect();
    assert_eq!(loads.len(), 2);
    assert_eq!(loads[1].body["lora_name"], "policy-lora");
    assert_eq!(loads[1].body["load_inplace"], true);
    let sent = std::path::PathBuf::from(loads[1].body["lora_path"].as_str().unwrap());
    assert!(sent.is_absolute() && sent.ends_with("step_2"), "{sent:?}");
    assert!(!seen.lock().unwrap().iter().any(|s| s.path == "/update_weights"), "full-weight route unused");

    // Sampling and scoring at version 2 reach the adapter.
    ModelClient::new()
        .chat(&runtime(&url, policy.model_at(2)), &[Message::user("hello")], &[], None, 2, None)
        .await
        .unwrap();
    m.score("policy", &[5, 6, 7], Some(2), None).await.unwrap();
    let scored = seen.lock().unwrap().iter().rev().find(|s| s.path == "/v1/completions").cloned().unwrap();
    assert_eq!(scored.body["model"], "policy-lora");
    assert_eq!(scored.body["cache_salt"], "2");

    // A vLLM started without runtime LoRA updates lacks the route: the error says how to start it.
    let (plain, _) = start_with(true, false).await;
    let dir = broadcasts.path().join("step_1");
    let e = models_with_lora(&plain, Some("policy-lora")).update_weights(&plain, &dir).await.unwrap_err().to_string();
    assert!(e.contains("404") && e.contains("VLLM_ALLOW_RUNTIME_LORA_UPDATING") && e.contains("--enable-lora"), "{e}");
    // A directory without an adapter: vLLM's own message, not retried.
    let (url, _) = start_with(true, true).await;
    let empty = tempfile::tempdir().unwrap();
    let e =
        models_with_lora(&url, Some("policy-lora")).update_weights(&url, empty.path()).await.unwrap_err().to_string();
    assert!(e.contains("No adapter found"), "{e}");
}
