//! A scripted OpenAI-compatible model server for tests (feature `fake-model`). It renders messages
//! with a Qwen-style template and uses bytes as token ids, so token prefixes behave like a real
//! server's: each turn's prompt extends the previous prompt plus completion. It also scores token
//! ids (`/v1/completions` with `prompt_logprobs`, by `prompt_logprob`) and tokenizes messages
//! (`/tokenize`), counting how many scoring requests were in flight at once.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

/// What the script sees of a request.
#[derive(Debug, Clone)]
pub struct FakeRequest {
    /// (role, content) of each message.
    pub messages: Vec<(String, String)>,
    /// The whole request body.
    pub body: Value,
    /// Choice index within the request (0..n).
    pub choice: u32,
    /// Request headers (lower-case names).
    pub headers: std::collections::BTreeMap<String, String>,
}

impl FakeRequest {
    /// Content of the last user message.
    pub fn last_user(&self) -> &str {
        self.messages.iter().rev().find(|(r, _)| r == "user").map_or("", |(_, c)| c.as_str())
    }

    /// Content of the system message.
    pub fn system(&self) -> &str {
        self.messages.iter().find(|(r, _)| r == "system").map_or("", |(_, c)| c.as_str())
    }

    /// Number of assistant messages already in the conversation.
    pub fn turn(&self) -> usize {
        self.messages.iter().filter(|(r, _)| r == "assistant").count()
    }
}

/// What the script answers.
#[derive(Debug, Clone)]
pub enum FakeReply {
    /// A completion with this text (and `finish_reason` stop).
    Text(String),
    /// A completion with tool calls: (name, JSON arguments).
    ToolCalls(Vec<(String, String)>),
    /// An HTTP error.
    Error(u16, String),
    /// The reply, after a delay.
    Delayed(std::time::Duration, Box<FakeReply>),
}

type Script = dyn Fn(&FakeRequest) -> FakeReply + Send + Sync;

/// The end-of-turn marker appended to every completion.
pub const END: &str = "<|im_end|>";

/// Logprob given to every sampled token.
pub const TOKEN_LOGPROB: f32 = -0.25;

/// The logprob the fake server gives token `id` when scoring (deterministic, id-dependent).
pub fn prompt_logprob(id: u32) -> f32 {
    -0.1 * (id % 5) as f32 - 0.05
}

/// How long one scoring request takes (so concurrent ones overlap).
const SCORE_DELAY: std::time::Duration = std::time::Duration::from_millis(15);

#[derive(Clone)]
struct AppState {
    script: Arc<Script>,
    requests: Arc<Mutex<Vec<Value>>>,
    weight_updates: Arc<Mutex<Vec<Value>>>,
    scoring: Arc<Mutex<(usize, usize, usize)>>,
    scored: Arc<Mutex<Vec<Vec<u32>>>>,
}

/// A running fake server.
#[derive(Debug)]
pub struct FakeModel {
    /// Its OpenAI base URL (`http://127.0.0.1:PORT/v1`).
    pub base_url: String,
    requests: Arc<Mutex<Vec<Value>>>,
    weight_updates: Arc<Mutex<Vec<Value>>>,
    scoring: Arc<Mutex<(usize, usize, usize)>>,
    scored: Arc<Mutex<Vec<Vec<u32>>>>,
    _shutdown: tokio::sync::oneshot::Sender<()>,
}

impl FakeModel {
    /// Starts a server answering with `script` on 127.0.0.1, a free port.
    pub async fn start(script: impl Fn(&FakeRequest) -> FakeReply + Send + Sync + 'static) -> Self {
        let requests = Arc::new(Mutex::new(Vec::new()));
        let weight_updates = Arc::new(Mutex::new(Vec::new()));
        let scoring = Arc::new(Mutex::new((0, 0, 0)));
        let scored = Arc::new(Mutex::new(Vec::new()));
        let state = AppState {
            script: Arc::new(script),
            requests: Arc::clone(&requests),
            weight_updates: Arc::clone(&weight_updates),
            scoring: Arc::clone(&scoring),
            scored: Arc::clone(&scored),
        };
        let app = Router::new()
            .route("/v1/chat/completions", post(chat))
            .route("/v1/completions", post(score))
            .route("/tokenize", post(tokenize))
            .route("/health", axum::routing::get(|| async { "ok" }))
            .route("/update_weights", post(update_weights))
            .with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the fake model");
        let addr: SocketAddr = listener.local_addr().expect("bound address");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            use axum::serve::ListenerExt;
            let listener = listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await;
        });
        FakeModel { base_url: format!("http://{addr}/v1"), requests, weight_updates, scoring, scored, _shutdown: tx }
    }

    /// The token ids of every scoring request so far.
    pub fn scored_prompts(&self) -> Vec<Vec<u32>> {
        self.scored.lock().expect("scored lock").clone()
    }

    /// (scoring requests served, most in flight at once).
    pub fn scoring_stats(&self) -> (usize, usize) {
        let s = self.scoring.lock().expect("scoring lock");
        (s.1, s.2)
    }

    /// Every `/update_weights` body received so far.
    pub fn weight_updates(&self) -> Vec<Value> {
        self.weight_updates.lock().expect("updates lock").clone()
    }

    /// Every request body received so far.
    pub fn requests(&self) -> Vec<Value> {
        self.requests.lock().expect("requests lock").clone()
    }
}

/// Renders messages as the fake template does (what its token ids are the bytes of).
pub fn render(messages: &[(String, String)]) -> String {
    let mut s = String::new();
    for (role, content) in messages {
        s.push_str(&format!("<|im_start|>{role}\n{content}{END}\n"));
    }
    s.push_str("<|im_start|>assistant\n");
    s
}

fn byte_ids(s: &str) -> Vec<u32> {
    s.bytes().map(u32::from).collect()
}

fn messages_of(body: &Value) -> Vec<(String, String)> {
    body["messages"]
        .as_array()
        .map(|ms| {
            ms.iter()
                .map(|m| (m["role"].as_str().unwrap_or("").to_owned(), m["content"].as_str().unwrap_or("").to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// `/tokenize`: the rendered messages' bytes (without the generation prompt unless asked).
async fn tokenize(axum::Json(body): axum::Json<Value>) -> axum::Json<Value> {
    let mut text = render(&messages_of(&body));
    if !body["add_generation_prompt"].as_bool().unwrap_or(true) {
        text.truncate(text.len() - "<|im_start|>assistant\n".len());
    }
    let tokens = byte_ids(&text);
    axum::Json(json!({"count": tokens.len(), "tokens": tokens}))
}

/// `/v1/completions` used for scoring: prompt token ids in, `prompt_logprobs` out.
async fn score(State(state): State<AppState>, axum::Json(body): axum::Json<Value>) -> Response {
    let Some(ids) = body["prompt"].as_array().map(|a| a.iter().filter_map(Value::as_u64).collect::<Vec<_>>()) else {
        return (StatusCode::BAD_REQUEST, "prompt must be token ids").into_response();
    };
    state.scored.lock().expect("scored lock").push(ids.iter().map(|&i| i as u32).collect());
    {
        let mut s = state.scoring.lock().expect("scoring lock");
        s.0 += 1;
        s.1 += 1;
        s.2 = s.2.max(s.0);
    }
    tokio::time::sleep(SCORE_DELAY).await;
    state.scoring.lock().expect("scoring lock").0 -= 1;
    let items: Vec<Value> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            if i == 0 {
                Value::Null
            } else {
                json!({ id.to_string(): {"logprob": prompt_logprob(*id as u32), "rank": 1} })
            }
        })
        .collect();
    axum::Json(json!({"id": "fake", "object": "text_completion", "choices": [{"index": 0, "text": ""}], "prompt_logprobs": items}))
        .into_response()
}

async fn update_weights(State(state): State<AppState>, axum::Json(body): axum::Json<Value>) -> axum::Json<Value> {
    let mut updates = state.weight_updates.lock().expect("updates lock");
    updates.push(body);
    axum::Json(json!({"status": "ok", "version": updates.len()}))
}

async fn chat(
    State(state): State<AppState>,
    header_map: axum::http::HeaderMap,
    axum::Json(body): axum::Json<Value>,
) -> Response {
    let headers = header_map
        .iter()
        .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
        .collect::<std::collections::BTreeMap<_, _>>();
    state.requests.lock().expect("requests lock").push(body.clone());
    let messages = messages_of(&body);
    let n = body["n"].as_u64().unwrap_or(1) as u32;
    let max_tokens = body["max_completion_tokens"].as_u64().map(|m| m as usize);
    let prompt = render(&messages);
    let mut choices = Vec::new();
    for choice in 0..n {
        let req = FakeRequest { messages: messages.clone(), body: body.clone(), choice, headers: headers.clone() };
        let mut reply = (state.script)(&req);
        while let FakeReply::Delayed(delay, inner) = reply {
            tokio::time::sleep(delay).await;
            reply = *inner;
        }
        let (text, tool_calls) = match reply {
            FakeReply::Text(t) => (t, Vec::new()),
            FakeReply::ToolCalls(calls) => (String::new(), calls),
            FakeReply::Error(code, message) => {
                let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                return (status, axum::Json(json!({"error": {"message": message}}))).into_response();
            }
            FakeReply::Delayed(..) => unreachable!("delays are unwrapped above"),
        };
        let mut ids = byte_ids(&format!("{text}{END}"));
        let mut finish = if tool_calls.is_empty() { "stop" } else { "tool_calls" };
        let mut content = text;
        if let Some(max) = max_tokens
            && ids.len() > max
        {
            ids.truncate(max);
            content = String::from_utf8_lossy(&ids.iter().map(|&b| b as u8).collect::<Vec<u8>>()).into_owned();
            finish = "length";
        }
        let calls: Vec<Value> = tool_calls
            .iter()
            .enumerate()
            .map(|(i, (name, args))| json!({"id": format!("call_{i}"), "type": "function", "function": {"name": name, "arguments": args}}))
            .collect();
        let mut message = json!({"role": "assistant", "content": content});
        if !calls.is_empty() {
            message["tool_calls"] = Value::Array(calls);
        }
        choices.push(json!({
            "index": choice,
            "message": message,
            "finish_reason": finish,
            "token_ids": ids,
            "logprobs": {"content": ids.iter().map(|_| json!({"token": "", "logprob": TOKEN_LOGPROB})).collect::<Vec<_>>()},
        }));
    }
    axum::Json(json!({
        "id": "fake",
        "object": "chat.completion",
        "model": body["model"],
        "prompt_token_ids": byte_ids(&prompt),
        "choices": choices,
    }))
    .into_response()
}
