//! HTTP routes: OpenAI chat completions (their work in `chat.rs`), the Responses API
//! (`responses/`), text completions (vLLM extensions included), vLLM's token-in
//! `/inference/v1/generate` (`generate.rs`), models, health, and the admin endpoints
//! `/update_weights`, `/pause`, `/resume`.

use std::path::PathBuf;

use axum::extract::{DefaultBodyLimit, State};
use axum::middleware::from_fn_with_state;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::api::{ChatRequest, CompletionRequest, Sampling, TokenizeRequest};
use crate::auth::{self, Keys};
use crate::error::{ApiJson, Error, Result};
use crate::generation::{GenOutput, GenRequest};
use crate::prompt::Prompt;
use crate::state::{AppState, finish_reason};
use crate::stream::Kind;

/// The router with body-size limits; every route but `/health` behind its key.
pub(crate) fn router(state: AppState, max_body: usize, keys: &Keys) -> Router {
    let api = Router::new()
        .route("/v1/models", get(models))
        .route("/detokenize", post(detokenize))
        .route("/metrics", get(metrics))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/responses", post(responses))
        .route("/inference/v1/generate", post(crate::generate::generate))
        .route("/tokenize", post(tokenize))
        .route_layer(from_fn_with_state(keys.api.clone(), auth::require));
    let admin = Router::new()
        .route("/update_weights", post(update_weights))
        .route("/pause", post(pause))
        .route("/resume", post(resume))
        .route_layer(from_fn_with_state(keys.admin_or_api(), auth::require));
    Router::new()
        .route("/health", get(health))
        .route("/version", get(version))
        .merge(api)
        .merge(admin)
        .fallback(unknown_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state)
}

/// Unknown paths get the OpenAI error object too (404), not an empty body.
async fn unknown_route(uri: axum::http::Uri) -> Error {
    Error::NotFound(format!("no route {}", uri.path()))
}

/// A known path with the wrong method (405), as an OpenAI error object.
async fn wrong_method(method: axum::http::Method, uri: axum::http::Uri) -> Error {
    Error::WrongMethod(format!("{method} is not allowed on {}", uri.path()))
}

/// 200 while the engine can serve; 503 with the reason when its thread has stopped or it is stuck
/// (has work but finished no step for `stuck_after_s`), so a supervisor sees what clients feel.
async fn health(State(s): State<AppState>) -> Result<Json<Value>> {
    s.engine.health(s.stuck_after).map_err(Error::Unhealthy)?;
    Ok(Json(json!({"status": "ok", "boot_id": &*s.boot_id})))
}

async fn models(State(s): State<AppState>) -> Json<Value> {
    Json(json!({"object": "list", "data": [{
        "id": s.limits.model_name, "object": "model", "created": s.started, "owned_by": "rl",
        "root": s.limits.model_name, "parent": null, "max_model_len": s.limits.max_model_len
    }]}))
}

/// vLLM's `/version`.
async fn version() -> Json<Value> {
    Json(json!({"version": env!("CARGO_PKG_VERSION")}))
}

/// Prometheus text: the engine's queue and the request and token counters.
async fn metrics(State(s): State<AppState>) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    let (waiting, running) = s.engine.load();
    let text = s.stats.render(&s.limits.model_name, waiting, running);
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}

#[derive(Deserialize)]
struct DetokenizeRequest {
    tokens: Vec<u32>,
}

/// vLLM's `/detokenize`: token ids to text.
async fn detokenize(State(s): State<AppState>, ApiJson(req): ApiJson<DetokenizeRequest>) -> Result<Json<Value>> {
    if let Some(bad) = req.tokens.iter().find(|&&t| t as usize >= s.limits.vocab_size) {
        return Err(Error::BadRequest(format!("token id {bad} is outside the vocabulary of {}", s.limits.vocab_size)));
    }
    let text = s.tok.decode(&req.tokens).map_err(Error::from)?;
    Ok(Json(json!({"prompt": text})))
}

#[derive(Deserialize)]
struct UpdateWeights {
    weight_dir: PathBuf,
}

/// Malformed bodies get the OpenAI error object, as on every other route.
async fn update_weights(State(s): State<AppState>, ApiJson(body): ApiJson<Value>) -> Result<Json<Value>> {
    let body: UpdateWeights = serde_json::from_value(body)
        .map_err(|e| Error::BadRequest(format!("expected a JSON body {{\"weight_dir\": \"...\"}}: {e}")))?;
    let dir = within_roots(&body.weight_dir, &s.weight_roots)?;
    let version = s.engine.update_weights(dir, s.timeout).await?;
    tracing::info!(dir = %body.weight_dir.display(), version, "weights updated");
    Ok(Json(json!({"status": "ok", "version": version})))
}

/// `dir` resolved (symlinks included) when it lies under one of `roots` (any directory when there
/// are none). Errors do not say what exists where.
fn within_roots(dir: &std::path::Path, roots: &[PathBuf]) -> Result<PathBuf> {
    if roots.is_empty() {
        return Ok(dir.to_owned());
    }
    let outside = || Error::BadRequest(String::from("weight_dir is not a directory under the server's weight roots"));
    let real = std::fs::canonicalize(dir).map_err(|_| outside())?;
    // Roots are resolved at each call: the run's broadcast directory appears after the server starts.
    if roots.iter().filter_map(|r| std::fs::canonicalize(r).ok()).any(|r| real.starts_with(r)) {
        Ok(real)
    } else {
        Err(outside())
    }
}

async fn pause(State(s): State<AppState>) -> Result<Json<Value>> {
    s.engine.pause().await?;
    Ok(Json(json!({"status": "paused"})))
}

async fn resume(State(s): State<AppState>) -> Result<Json<Value>> {
    s.engine.resume().await?;
    Ok(Json(json!({"status": "running"})))
}

async fn chat(State(s): State<AppState>, ApiJson(req): ApiJson<ChatRequest>) -> Result<Response> {
    Ok(match crate::chat::chat_reply(&s, req).await? {
        crate::chat::ChatReply::Whole(body) => Json(body).into_response(),
        crate::chat::ChatReply::Stream(events) => events,
    })
}

/// OpenAI's Responses API: the request read as the chat completion it amounts to, answered as a
/// response object or its typed events (`responses/`).
async fn responses(State(s): State<AppState>, ApiJson(body): ApiJson<Value>) -> Result<Response> {
    let (req, mut echo) = crate::responses::chat_request(body)?;
    echo.model.clone_from(&s.limits.model_name);
    Ok(match crate::chat::chat_reply(&s, req).await? {
        crate::chat::ChatReply::Whole(chat) => Json(crate::responses::response_object(&chat, &echo)).into_response(),
        crate::chat::ChatReply::Stream(events) => crate::responses::events(events, echo),
    })
}

/// vLLM's `/tokenize`: what a chat request's (or a text prompt's) tokens would be.
async fn tokenize(State(s): State<AppState>, ApiJson(req): ApiJson<TokenizeRequest>) -> Result<Json<Value>> {
    s.limits.check_model(req.model.as_ref())?;
    let text = match (&req.messages, &req.prompt) {
        (Some(messages), None) => {
            let tools = req.tools.clone().unwrap_or_default();
            let kwargs = req.chat_template_kwargs.clone().unwrap_or_default();
            let ending = (req.add_generation_prompt, req.continue_final_message);
            crate::chat::chat_text(&s, &crate::chat::template_messages(messages)?, &tools, ending, &kwargs)?
        }
        (None, Some(prompt)) => prompt.clone(),
        _ => return Err(Error::BadRequest(String::from("give exactly one of `messages` and `prompt`"))),
    };
    let tokens = s.encode(&text)?;
    Ok(Json(json!({"count": tokens.len(), "max_model_len": s.limits.max_model_len, "tokens": tokens})))
}

async fn completions(State(s): State<AppState>, ApiJson(req): ApiJson<CompletionRequest>) -> Result<Response> {
    let encode = |p: &Prompt| -> Result<Vec<u32>> {
        match p {
            Prompt::Text(t) => s.encode(t),
            Prompt::Ids(ids) => Ok(ids.clone()),
            Prompt::Batch(_) => Err(Error::BadRequest(String::from("prompt lists cannot nest"))),
        }
    };
    // What `echo` puts before a completion: the prompt as given, or its ids decoded.
    let echoed = |p: &Prompt, ids: &[u32]| -> Option<String> {
        req.sampling.echo.then(|| match p {
            Prompt::Text(t) => t.clone(),
            _ => s.tok.decode(ids).unwrap_or_default(),
        })
    };
    if req.sampling.echo && req.sampling.stream {
        return Err(Error::BadRequest(String::from("echo is not supported with stream = true")));
    }
    let Prompt::Batch(batch) = &req.prompt else {
        let prompt = encode(&req.prompt)?;
        let gen_req = req.sampling.to_request(prompt.clone(), &s.limits, s.next_seed())?;
        if req.sampling.stream {
            let plain = crate::stream::Parse::default();
            return Ok(crate::stream::respond(s.clone(), Kind::Text, gen_req, req.sampling.clone(), prompt, plain));
        }
        let out = s.run(gen_req).await?;
        let echo = echoed(&req.prompt, &prompt);
        let choices = completion_choices(&s, &out, 0, &req.sampling, None, echo.as_deref());
        return Ok(
            Json(s.response_body("cmpl", "text_completion", choices, &prompt, &out, &req.sampling)).into_response()
        );
    };
    if req.sampling.stream {
        return Err(Error::BadRequest(String::from("stream = true takes one prompt, not a list")));
    }
    // A list of prompts (vLLM): each gets `n` choices, indexed prompt by prompt, run together.
    if batch.is_empty() || batch.len() > s.limits.max_n as usize {
        return Err(Error::BadRequest(format!("prompt lists hold 1 to {} prompts", s.limits.max_n)));
    }
    if req.sampling.prompt_logprobs.is_some() {
        return Err(Error::BadRequest(String::from("prompt_logprobs is supported for one prompt at a time")));
    }
    let prompts: Vec<Vec<u32>> = batch.iter().map(encode).collect::<Result<_>>()?;
    let echoes: Vec<Option<String>> = batch.iter().zip(&prompts).map(|(p, ids)| echoed(p, ids)).collect();
    let requests: Vec<GenRequest> =
        prompts.iter().map(|p| req.sampling.to_request(p.clone(), &s.limits, s.next_seed())).collect::<Result<_>>()?;
    let outs = futures::future::try_join_all(requests.into_iter().map(|r| s.run(r))).await?;
    let mut choices = Vec::new();
    let (mut prompt_tokens, mut completion_tokens, mut cached) = (0, 0, 0);
    for (k, ((prompt, out), echo)) in prompts.iter().zip(&outs).zip(&echoes).enumerate() {
        let ids = req.sampling.return_token_ids.then_some(prompt.as_slice());
        let first = k * req.sampling.n as usize;
        choices.extend(completion_choices(&s, out, first, &req.sampling, ids, echo.as_deref()));
        prompt_tokens += prompt.len();
        completion_tokens += out.completions.iter().map(|c| c.token_ids.len()).sum::<usize>();
        cached += out.cached_tokens;
    }
    let mut body = s.response_body("cmpl", "text_completion", choices, &prompts[0], &outs[0], &req.sampling);
    body["usage"] = json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": {"cached_tokens": cached}});
    if let Some(map) = body.as_object_mut() {
        // Per choice instead (one prompt per choice set).
        map.remove("prompt_token_ids");
    }
    Ok(Json(body).into_response())
}

/// The choices of one prompt's completions, indexed from `first`; with `prompt_ids`, each choice
/// carries its prompt's token ids (prompt lists); with `echo`, its text starts with the prompt and
/// its logprobs with the prompt's tokens (the first has none, as in OpenAI's and vLLM's).
fn completion_choices(
    s: &AppState,
    out: &GenOutput,
    first: usize,
    sampling: &Sampling,
    prompt_ids: Option<&[u32]>,
    echo: Option<&str>,
) -> Vec<Value> {
    let text_of = |id: u32| s.tok.decode(&[id]).unwrap_or_default();
    // Prompt positions: (token, its logprob, alternatives with the token itself among them).
    let prompt_entries: Vec<(String, Value, Value)> = match (echo, &out.prompt_logprobs) {
        (Some(_), Some(items)) => items
            .iter()
            .map(|item| match item {
                None => (String::new(), Value::Null, Value::Null),
                Some(t) => {
                    let mut top: serde_json::Map<String, Value> = serde_json::Map::new();
                    top.insert(text_of(t.id), json!(t.logprob));
                    for (id, lp) in &t.top {
                        top.entry(text_of(*id)).or_insert(json!(lp));
                    }
                    (text_of(t.id), json!(t.logprob), Value::Object(top))
                }
            })
            .collect(),
        _ => Vec::new(),
    };
    out.completions
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let logprobs = if sampling.wants_logprobs() {
                let sampled = c.logprobs.iter().map(|t| {
                    let top: serde_json::Map<String, Value> = t.top.iter().map(|(id, lp)| (text_of(*id), json!(lp))).collect();
                    (text_of(t.id), json!(t.logprob), Value::Object(top))
                });
                let (tokens, (lps, tops)): (Vec<String>, (Vec<Value>, Vec<Value>)) =
                    prompt_entries.iter().cloned().chain(sampled).map(|(t, lp, top)| (t, (lp, top))).unzip();
                // Where each token starts in the returned text, in characters (OpenAI's field).
                let offsets: Vec<usize> = tokens
                    .iter()
                    .scan(0, |at, t| {
                        let start = *at;
                        *at += t.chars().count();
                        Some(start)
                    })
                    .collect();
                json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
            } else {
                Value::Null
            };
            let text = format!("{}{}", echo.unwrap_or_default(), c.text);
            let mut choice =
                json!({"index": first + i, "text": text, "logprobs": logprobs, "finish_reason": finish_reason(c, false)});
            if sampling.return_token_ids {
                choice["token_ids"] = json!(c.token_ids);
            }
            if let Some(ids) = prompt_ids {
                choice["prompt_token_ids"] = json!(ids);
            }
            choice
        })
        .collect()
}
