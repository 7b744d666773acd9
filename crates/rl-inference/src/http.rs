//! HTTP routes: OpenAI chat and text completions (vLLM extensions included), vLLM's token-in
//! `/inference/v1/generate` (`generate.rs`), models, health, and the admin endpoints `/update_weights`, `/pause`, `/resume`.

use std::path::PathBuf;

use axum::extract::{DefaultBodyLimit, State};
use axum::middleware::from_fn_with_state;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use rl_model::{TemplateFunction, TemplateMessage, TemplateToolCall};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::api::{ChatMessage, ChatRequest, CompletionRequest, Sampling, TokenizeRequest, content_text};
use crate::auth::{self, Keys};
use crate::error::{ApiJson, Error, Result};
use crate::generation::{GenOutput, GenRequest};
use crate::prompt::Prompt;
use crate::state::{AppState, finish_reason};
use crate::stream::Kind;
use crate::structured::{Constraint, JsonStyle};
use crate::tool_calls::{ToolChoice, tool_choice};

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

fn template_messages(messages: &[ChatMessage]) -> Result<Vec<TemplateMessage>> {
    messages
        .iter()
        .map(|m| {
            // OpenAI's `developer` role (its newer name for system instructions, which the OpenAI
            // SDK and agent frameworks send) is a system message to chat templates, which know no other.
            let role = if m.role == "developer" { "system" } else { m.role.as_str() };
            if !["system", "user", "assistant", "tool"].contains(&role) {
                return Err(Error::BadRequest(format!(
                    "unknown message role {:?} (expected system, developer, user, assistant or tool)",
                    m.role
                )));
            }
            let tool_calls = m
                .tool_calls
                .iter()
                .flatten()
                .map(|c| {
                    let f = &c["function"];
                    let arguments = match &f["arguments"] {
                        Value::String(s) => s.clone(),
                        Value::Null => String::from("{}"),
                        other => other.to_string(),
                    };
                    Ok(TemplateToolCall {
                        kind: String::from("function"),
                        function: TemplateFunction {
                            name: f["name"]
                                .as_str()
                                .ok_or_else(|| Error::BadRequest(String::from("a tool call has no function.name")))?
                                .to_owned(),
                            arguments,
                        },
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(TemplateMessage {
                role: role.to_owned(),
                content: content_text(m.content.as_ref())?,
                tool_calls,
                reasoning_content: m.reasoning_content.clone(),
            })
        })
        .collect()
}

async fn chat(State(s): State<AppState>, ApiJson(req): ApiJson<ChatRequest>) -> Result<Response> {
    Ok(match chat_reply(&s, req).await? {
        ChatReply::Whole(body) => Json(body).into_response(),
        ChatReply::Stream(events) => events,
    })
}

/// OpenAI's Responses API: the request read as the chat completion it amounts to, answered as a
/// response object or its typed events (`responses/`).
async fn responses(State(s): State<AppState>, ApiJson(body): ApiJson<Value>) -> Result<Response> {
    let (req, echo) = crate::responses::chat_request(body)?;
    Ok(match chat_reply(&s, req).await? {
        ChatReply::Whole(chat) => Json(crate::responses::response_object(&chat, &echo)).into_response(),
        ChatReply::Stream(events) => crate::responses::events(events, echo),
    })
}

/// A chat completion: the whole body, or (`stream = true`) its server-sent events.
pub(crate) enum ChatReply {
    Whole(Value),
    Stream(Response),
}

/// Answers a chat completion request (the chat route's work, which `/v1/responses` shares).
pub(crate) async fn chat_reply(s: &AppState, req: ChatRequest) -> Result<ChatReply> {
    if req.messages.is_empty() {
        return Err(Error::BadRequest(String::from("messages must not be empty")));
    }
    if req.sampling.echo {
        return Err(Error::BadRequest(String::from("echo is supported on /v1/completions, not on chat completions")));
    }
    let messages = template_messages(&req.messages)?;
    let tools = req.tools.clone().unwrap_or_default();
    let choice = tool_choice(req.tool_choice.as_ref(), &tools)?;
    let text = chat_text(
        s,
        &messages,
        &tools,
        (req.add_generation_prompt, req.continue_final_message),
        &req.chat_template_kwargs,
    )?;
    let prompt = s.encode(&text)?;
    let mut gen_req = req.sampling.to_request(prompt.clone(), &s.limits, s.next_seed())?;
    let format = s.tool_format.filter(|_| choice != ToolChoice::None && !tools.is_empty());
    // The calls a forcing tool_choice asks for: of one named tool (one call), or any (several
    // unless parallel_tool_calls is false).
    let forced = match &choice {
        ToolChoice::Required => Some((None, req.parallel_tool_calls)),
        ToolChoice::Named(name) => Some((Some(name.as_str()), false)),
        ToolChoice::None | ToolChoice::Auto => None,
    };
    if let Some((only, many)) = forced {
        // The calls are written in the model's call format and parsed back into `tool_calls`.
        let Some(format) = format else {
            return Err(Error::BadRequest(format!(
                "tool_choice {} needs a tool-call parser; this server has none (inference.tool_call_parser = \"none\")",
                req.tool_choice.as_ref().map_or_else(String::new, ToString::to_string),
            )));
        };
        let calls = Constraint::tool_calls(&tools, only, many, format);
        if gen_req.guide.is_some() {
            return Err(Error::BadRequest(String::from(
                "tool_choice that requires a call cannot be combined with another structured-output constraint",
            )));
        }
        // Arguments a tool does not declare are closed out: no caller can use them.
        let style = JsonStyle { closed_objects: true, ..JsonStyle::default() };
        gen_req.guide = Some(s.limits.grammars.compile(&calls, style)?);
    }
    if req.sampling.stream {
        let calls = format.map(|f| (f, req.parallel_tool_calls));
        let events = crate::stream::respond(s.clone(), Kind::Chat, gen_req, req.sampling.clone(), prompt, calls);
        return Ok(ChatReply::Stream(events));
    }
    let out = s.run(gen_req).await?;
    let choices: Vec<Value> = out
        .completions
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let (content, calls) =
                format.map_or_else(|| (c.text.clone(), Vec::new()), |f| f.parse(&c.text, req.parallel_tool_calls));
            let mut message = json!({"role": "assistant", "content": content});
            if !calls.is_empty() {
                message["tool_calls"] = Value::Array(
                    calls
                        .iter()
                        .enumerate()
                        .map(|(j, (name, args))| json!({"id": format!("call_{i}_{j}"), "type": "function", "function": {"name": name, "arguments": args}}))
                        .collect(),
                );
            }
            let mut choice = json!({
                "index": i,
                "message": message,
                "finish_reason": finish_reason(c, !calls.is_empty()),
                "logprobs": if req.sampling.wants_logprobs() {
                    json!({"content": c.logprobs.iter().map(|t| s.token_json(t)).collect::<Vec<_>>()})
                } else { Value::Null },
            });
            if req.sampling.return_token_ids {
                choice["token_ids"] = json!(c.token_ids);
            }
            choice
        })
        .collect();
    Ok(ChatReply::Whole(s.response_body("chatcmpl", "chat.completion", choices, &prompt, &out, &req.sampling)))
}

/// A chat's prompt text: the template with the request's variables, ending (`add_generation_prompt`,
/// `continue_final_message`) with the assistant's header, or in the final message left open.
fn chat_text(
    s: &AppState,
    messages: &[TemplateMessage],
    tools: &[Value],
    (add_generation_prompt, continued): (Option<bool>, bool),
    kwargs: &serde_json::Map<String, Value>,
) -> Result<String> {
    let text = s.template.render_with(messages, tools, generation_prompt(add_generation_prompt, continued)?, kwargs)?;
    if continued { open_final_message(text, messages) } else { Ok(text) }
}

/// Whether the template adds the assistant's header (`add_generation_prompt`, unset: unless the
/// final message is continued), refusing it together with `continue_final_message` as vLLM and
/// transformers do.
fn generation_prompt(add: Option<bool>, continued: bool) -> Result<bool> {
    match (add, continued) {
        (Some(true), true) => Err(Error::BadRequest(String::from(
            "continue_final_message and add_generation_prompt cannot both be true (set add_generation_prompt to false)",
        ))),
        (add, continued) => Ok(add.unwrap_or(!continued)),
    }
}

/// The prompt cut right after the final message's content, so the reply continues it
/// (`continue_final_message`), as transformers cuts it: at the last occurrence of the content,
/// or of the content trimmed (templates such as Llama 3.1's trim messages).
fn open_final_message(mut text: String, messages: &[TemplateMessage]) -> Result<String> {
    let content = messages.last().map_or("", |m| m.content.as_str());
    if content.trim().is_empty() {
        return Err(Error::BadRequest(String::from("continue_final_message needs a final message with content")));
    }
    let end = [content, content.trim()].iter().find_map(|c| text.rfind(c).map(|at| at + c.len()));
    match end {
        Some(end) => {
            text.truncate(end);
            Ok(text)
        }
        None => Err(Error::BadRequest(String::from(
            "continue_final_message: the chat template does not render the final message's content as written",
        ))),
    }
}

/// vLLM's `/tokenize`: what a chat request's (or a text prompt's) tokens would be.
async fn tokenize(State(s): State<AppState>, ApiJson(req): ApiJson<TokenizeRequest>) -> Result<Json<Value>> {
    s.limits.check_model(req.model.as_ref())?;
    let text = match (&req.messages, &req.prompt) {
        (Some(messages), None) => {
            let tools = req.tools.clone().unwrap_or_default();
            let kwargs = req.chat_template_kwargs.clone().unwrap_or_default();
            let ending = (req.add_generation_prompt, req.continue_final_message);
            chat_text(&s, &template_messages(messages)?, &tools, ending, &kwargs)?
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
            return Ok(crate::stream::respond(s.clone(), Kind::Text, gen_req, req.sampling.clone(), prompt, None));
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
