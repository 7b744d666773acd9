//! OpenAI-compatible chat-completions client for environments, asking for the vLLM extensions
//! training needs: `logprobs`, `return_token_ids` (`prompt_token_ids`, `choices[].token_ids`) and
//! `cache_salt`. Failures are classified into the error taxonomy.

use std::time::Duration;

use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::types::{Message, ModelRuntime, Role, ToolCall, ToolSpec, tool_calls_of};

/// Largest response body accepted, in bytes.
const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

/// Phrases servers use when a prompt exceeds the context length.
const CONTEXT_PHRASES: &[&str] = &[
    "maximum context length",
    "longer than the model's context length",
    "longer than the maximum model length",
    "exceeds the model's context length",
    "prompt_too_long",
    "context length",
    "maximum model length",
    "longer than the model length",
];

/// One sampled choice.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    /// The assistant message.
    pub message: Message,
    /// Sampled token ids (when the endpoint returns them).
    pub token_ids: Option<Vec<u32>>,
    /// Logprob of each sampled token.
    pub logprobs: Option<Vec<f32>>,
    /// `stop`, `length` or `tool_calls`.
    pub finish_reason: String,
}

/// A chat-completions response.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatResponse {
    /// The prompt as token ids (when the endpoint returns them).
    pub prompt_token_ids: Option<Vec<u32>>,
    /// The choices, `n` of them.
    pub choices: Vec<Choice>,
}

/// A client for OpenAI-compatible endpoints (`http://`, or `https://` through [`crate::http`]).
#[derive(Debug, Clone)]
pub struct ModelClient {
    http: reqwest::Client,
}

/// How long a model endpoint may take to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

impl Default for ModelClient {
    fn default() -> Self {
        ModelClient::new()
    }
}

impl ModelClient {
    /// A client with connection pooling; `https://` endpoints are checked against the system's
    /// root certificates.
    pub fn new() -> Self {
        Self::with_roots(&[])
    }

    /// A client that also trusts `extra_roots` for `https://` endpoints.
    pub fn with_roots(extra_roots: &[reqwest::Certificate]) -> Self {
        let http = crate::http::client_builder(extra_roots)
            .connect_timeout(CONNECT_TIMEOUT)
            .pool_idle_timeout(Duration::from_secs(60))
            .build()
            .expect("an HTTP client with the installed TLS provider always builds");
        ModelClient { http }
    }

    /// Requests `n` completions of `messages` from `runtime`. `session` (the rollout's id) is sent
    /// as `X-Session-ID`, so a data-parallel router keeps a multi-turn rollout on one replica and
    /// its prefix cache.
    pub async fn chat(
        &self,
        runtime: &ModelRuntime,
        messages: &[Message],
        tools: &[ToolSpec],
        seed: Option<u64>,
        n: u32,
        session: Option<&str>,
    ) -> Result<ChatResponse> {
        let body = request_body(runtime, messages, tools, seed, n);
        let url = format!("{}/chat/completions", runtime.base_url);
        crate::http::check_reachable_scheme(&url).map_err(|m| Error::bad_request("base_url", m))?;
        let mut request = self.http.post(&url).timeout(runtime.timeout).json(&body);
        if let Some(key) = &runtime.api_key {
            request = request.bearer_auth(&key.0);
        }
        for (name, value) in &runtime.headers {
            request = request.header(name, value);
        }
        if let Some(id) = session {
            request = request.header("X-Session-ID", id);
        }
        let response = request.send().await.map_err(|e| {
            // Name the timeout that fired: the connection one sends users to another knob.
            if e.is_connect() && e.is_timeout() {
                Error::Timeout(format!("model endpoint {url} did not accept a connection within {CONNECT_TIMEOUT:?}"))
            } else if e.is_timeout() {
                Error::Timeout(format!(
                    "model call to {url} took longer than {:?} (the model's timeout_s) before answering",
                    runtime.timeout
                ))
            } else if crate::http::is_tls_error(&e) {
                // A certificate or handshake problem: configuration, not a passing fault.
                Error::bad_request("base_url", format!("TLS with {url} failed: {}", crate::http::error_chain(&e)))
            } else {
                Error::Infrastructure(format!("model endpoint {url} unreachable: {}", crate::http::error_chain(&e)))
            }
        })?;
        let status = response.status();
        let bytes = read_bounded(response, &url, runtime.timeout).await?;
        let text = String::from_utf8_lossy(&bytes);
        if !status.is_success() {
            let snippet: String = text.chars().take(500).collect();
            let lower = snippet.to_lowercase();
            return Err(if status.is_server_error() || status.as_u16() == 429 {
                Error::Infrastructure(format!("model endpoint {url} answered {status}: {snippet}"))
            } else if CONTEXT_PHRASES.iter().any(|p| lower.contains(p)) {
                Error::OverlongPrompt(format!("{status}: {snippet}"))
            } else {
                Error::bad_request("actor", format!("model endpoint {url} rejected the request ({status}): {snippet}"))
            });
        }
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| Error::InvalidModelResponse(format!("response of {url} is not JSON: {e}")))?;
        parse_response(&value, runtime.tokens, n)
    }
}

async fn read_bounded(mut response: reqwest::Response, url: &str, timeout: Duration) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                if out.len() + chunk.len() > MAX_RESPONSE_BYTES {
                    return Err(Error::InvalidModelResponse(format!(
                        "response of {url} is larger than {MAX_RESPONSE_BYTES} bytes"
                    )));
                }
                out.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(out),
            Err(e) if e.is_timeout() => {
                return Err(Error::Timeout(format!(
                    "model call to {url} took longer than {timeout:?} (the model's timeout_s) while sending its response"
                )));
            }
            Err(e) => return Err(Error::Infrastructure(format!("reading the response of {url}: {e}"))),
        }
    }
}

/// The JSON request body.
pub(crate) fn request_body(
    runtime: &ModelRuntime,
    messages: &[Message],
    tools: &[ToolSpec],
    seed: Option<u64>,
    n: u32,
) -> Value {
    let s = &runtime.sampling;
    let mut body = serde_json::Map::new();
    for (k, v) in &s.extra {
        body.insert(k.clone(), v.clone());
    }
    body.insert(String::from("model"), json!(runtime.model));
    body.insert(String::from("messages"), Value::Array(messages.iter().map(Message::to_json).collect()));
    if !tools.is_empty() {
        body.insert(String::from("tools"), Value::Array(tools.iter().map(ToolSpec::to_json).collect()));
    }
    body.insert(String::from("n"), json!(n));
    if let Some(t) = s.temperature {
        body.insert(String::from("temperature"), json!(t));
    }
    if let Some(p) = s.top_p {
        body.insert(String::from("top_p"), json!(p));
    }
    if let Some(k) = s.top_k {
        body.insert(String::from("top_k"), json!(k));
    }
    if let Some(m) = s.max_completion_tokens {
        body.insert(String::from("max_completion_tokens"), json!(m));
    }
    if !s.stop.is_empty() {
        body.insert(String::from("stop"), json!(s.stop));
    }
    if let Some(seed) = seed.or(s.seed) {
        body.insert(String::from("seed"), json!(seed));
    }
    body.insert(String::from("logprobs"), json!(true));
    if runtime.tokens {
        body.insert(String::from("return_token_ids"), json!(true));
        crate::types::Sampling::state_neutral_fields(&mut body);
    }
    if let Some(salt) = &runtime.cache_salt {
        body.insert(String::from("cache_salt"), json!(salt));
    }
    Value::Object(body)
}

/// Parses a chat-completions response; with `tokens`, token ids and logprobs must be present.
pub(crate) fn parse_response(v: &Value, tokens: bool, n: u32) -> Result<ChatResponse> {
    let invalid = |m: String| Error::InvalidModelResponse(m);
    let choices = v.get("choices").and_then(Value::as_array).ok_or_else(|| invalid(String::from("no `choices`")))?;
    if choices.len() != n as usize {
        return Err(invalid(format!("asked for {n} choices, got {}", choices.len())));
    }
    let prompt_token_ids = v.get("prompt_token_ids").and_then(ids);
    if tokens && prompt_token_ids.is_none() {
        return Err(invalid(String::from(
            "no `prompt_token_ids`: the endpoint must support vLLM's `return_token_ids` to train on its tokens",
        )));
    }
    let mut out = Vec::with_capacity(choices.len());
    for (i, c) in choices.iter().enumerate() {
        let msg = c.get("message").ok_or_else(|| invalid(format!("choices[{i}] has no `message`")))?;
        let content = msg.get("content").and_then(Value::as_str).unwrap_or("").to_owned();
        let tool_calls = parse_tool_calls(msg, i)?;
        let finish_reason = c.get("finish_reason").and_then(Value::as_str).unwrap_or("stop").to_owned();
        let token_ids = c.get("token_ids").and_then(ids);
        let logprobs = c.get("logprobs").and_then(|l| l.get("content")).and_then(Value::as_array).map(|items| {
            items
                .iter()
                .map(|t| t.get("logprob").and_then(Value::as_f64).unwrap_or(f64::NAN) as f32)
                .collect::<Vec<f32>>()
        });
        if tokens {
            let ids = token_ids.as_ref().ok_or_else(|| invalid(format!("choices[{i}] has no `token_ids`")))?;
            let lps = logprobs.as_ref().ok_or_else(|| invalid(format!("choices[{i}] has no `logprobs.content`")))?;
            if ids.len() != lps.len() {
                return Err(invalid(format!("choices[{i}]: {} token ids but {} logprobs", ids.len(), lps.len())));
            }
            if lps.iter().any(|l| !l.is_finite()) {
                return Err(invalid(format!("choices[{i}]: a logprob is missing or not finite")));
            }
        }
        if content.is_empty() && tool_calls.is_empty() && token_ids.as_ref().is_none_or(Vec::is_empty) {
            return Err(invalid(format!("choices[{i}] is empty: no content, no tool calls, no tokens")));
        }
        out.push(Choice {
            message: Message { role: Role::Assistant, content, tool_calls, tool_call_id: None },
            token_ids,
            logprobs,
            finish_reason,
        });
    }
    Ok(ChatResponse { prompt_token_ids, choices: out })
}

fn parse_tool_calls(msg: &Value, i: usize) -> Result<Vec<ToolCall>> {
    tool_calls_of(msg).map_err(|e| Error::InvalidModelResponse(format!("choices[{i}].message{e}")))
}

fn ids(v: &Value) -> Option<Vec<u32>> {
    v.as_array()?.iter().map(|x| x.as_u64().and_then(|u| u32::try_from(u).ok())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Sampling;

    fn runtime(tokens: bool) -> ModelRuntime {
        ModelRuntime {
            base_url: String::from("http://127.0.0.1:1/v1"),
            model: String::from("m"),
            sampling: Sampling {
                temperature: Some(rl_configs::Temperature::new(0.7).unwrap()),
                max_completion_tokens: Some(8),
                ..Default::default()
            },
            tokens,
            cache_salt: Some(String::from("3")),
            timeout: Duration::from_secs(1),
            api_key: None,
            headers: Default::default(),
        }
    }

    #[test]
    fn request_asks_for_tokens_logprobs_and_salt() {
        let body = request_body(&runtime(true), &[Message::user("hi")], &[], Some(5), 2);
        assert_eq!(body["return_token_ids"], true);
        assert_eq!(body["logprobs"], true);
        assert_eq!(body["cache_salt"], "3");
        assert_eq!(body["seed"], 5);
        assert_eq!(body["n"], 2);
        assert_eq!(body["max_completion_tokens"], 8);
    }

    #[test]
    fn a_trained_actor_states_the_fields_a_server_would_fill_from_generation_config() {
        let mut actor = runtime(true);
        actor.sampling.top_k = Some(50);
        actor.sampling.extra.insert(String::from("repetition_penalty"), json!(1.1));
        let body = request_body(&actor, &[Message::user("hi")], &[], None, 1);
        assert_eq!((&body["top_p"], &body["top_k"], &body["min_p"]), (&json!(1.0), &json!(50), &json!(0.0)));
        assert_eq!(body["repetition_penalty"], 1.1, "what the config sets stays");
        // A judge or other endpoint (perhaps a hosted API that refuses vLLM's fields) gets none.
        let body = request_body(&runtime(false), &[Message::user("hi")], &[], None, 1);
        assert!(body.get("top_k").is_none() && body.get("min_p").is_none(), "{body}");
    }

    #[test]
    fn missing_token_ids_are_an_invalid_response_when_training() {
        let v = json!({"choices": [{"message": {"content": "x"}, "finish_reason": "stop"}]});
        assert!(parse_response(&v, false, 1).is_ok());
        let err = parse_response(&v, true, 1).unwrap_err();
        assert!(matches!(err, Error::InvalidModelResponse(_)) && err.retryable(), "{err}");
    }

    #[test]
    fn token_ids_and_logprobs_are_read() {
        let v = json!({
            "prompt_token_ids": [1, 2],
            "choices": [{"message": {"content": "ab"}, "finish_reason": "length", "token_ids": [7, 8],
                          "logprobs": {"content": [{"token": "a", "logprob": -0.5}, {"token": "b", "logprob": -1.0}]}}]
        });
        let r = parse_response(&v, true, 1).unwrap();
        assert_eq!(r.prompt_token_ids, Some(vec![1, 2]));
        assert_eq!(r.choices[0].token_ids, Some(vec![7, 8]));
        assert_eq!(r.choices[0].logprobs, Some(vec![-0.5, -1.0]));
        assert_eq!(r.choices[0].finish_reason, "length");
    }
}
