//! vLLM's token-in, token-out route `POST /inference/v1/generate`: prompt token ids and
//! `sampling_params` in; sampled token ids with `token_id:<id>` logprobs out. Training clients
//! that render prompts themselves (verifiers' train client through `renderers`) call it; it runs
//! on the same engine path as `/v1/completions` (batching, prompt cache, keys, limits).

use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde_json::{Value, json};

use crate::api::Sampling;
use crate::error::{ApiJson, Error, Result};
use crate::generation::{GenOutput, TokenLogprob};
use crate::state::{AppState, finish_reason, usage};

/// The request body, read field by field (the token ids stream into a `Vec<u32>`).
#[derive(Debug)]
pub(crate) struct GenerateRequest {
    request_id: Option<String>,
    token_ids: Vec<u32>,
    sampling: Sampling,
    model: Option<String>,
    stream: bool,
    priority: i64,
    /// Fields this server cannot honour, by name, when the request set them.
    unsupported: Vec<&'static str>,
}

impl<'de> Deserialize<'de> for GenerateRequest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Fields;
        impl<'de> Visitor<'de> for Fields {
            type Value = GenerateRequest;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a generate request object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<GenerateRequest, A::Error> {
                let (mut request_id, mut token_ids, mut sampling, mut model) = (None, None, None, None);
                let (mut stream, mut priority, mut unsupported) = (false, 0, Vec::new());
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "request_id" => request_id = map.next_value()?,
                        "token_ids" => token_ids = Some(map.next_value()?),
                        "sampling_params" => sampling = Some(map.next_value::<Value>()?),
                        "model" => model = map.next_value()?,
                        "stream" => stream = map.next_value::<Option<bool>>()?.unwrap_or(false),
                        "priority" => priority = map.next_value::<Option<i64>>()?.unwrap_or(0),
                        // Multimodal inputs and disaggregated prefill need machinery this engine lacks.
                        "features" | "content_parts" | "kv_transfer_params" => {
                            if !map.next_value::<Value>()?.is_null() {
                                unsupported.push(match key.as_str() {
                                    "features" => "features",
                                    "content_parts" => "content_parts",
                                    _ => "kv_transfer_params",
                                });
                            }
                        }
                        // `cache_salt`, `stream_options`, `return_token_ids` and anything unknown:
                        // accepted, as the OpenAI routes accept unknown fields.
                        _ => {
                            map.next_value::<de::IgnoredAny>()?;
                        }
                    }
                }
                let sampling = sampling.ok_or_else(|| de::Error::missing_field("sampling_params"))?;
                if !sampling.is_object() {
                    return Err(de::Error::custom("sampling_params must be an object"));
                }
                Ok(GenerateRequest {
                    request_id,
                    token_ids: token_ids.ok_or_else(|| de::Error::missing_field("token_ids"))?,
                    sampling: Sampling::from_fields(sampling)
                        .map_err(|e| de::Error::custom(format!("sampling_params: {e}")))?,
                    model,
                    stream,
                    priority,
                    unsupported,
                })
            }
        }
        d.deserialize_map(Fields)
    }
}

/// `POST /inference/v1/generate`.
pub(crate) async fn generate(State(s): State<AppState>, ApiJson(req): ApiJson<GenerateRequest>) -> Result<Json<Value>> {
    if let Some(field) = req.unsupported.first() {
        return Err(Error::BadRequest(format!(
            "{field} is not supported by this server (text-only, no disaggregated prefill)"
        )));
    }
    if req.stream || req.sampling.stream {
        return Err(Error::BadRequest(String::from("stream = true is not supported on /inference/v1/generate")));
    }
    if req.priority != 0 {
        return Err(Error::BadRequest(format!(
            "priority {} was given, but this server does not schedule by priority; use 0",
            req.priority
        )));
    }
    s.limits.check_model(req.model.as_ref())?;
    if req.sampling.echo {
        return Err(Error::BadRequest(String::from("sampling_params.echo is supported on /v1/completions only")));
    }
    let gen_req = req.sampling.to_request(req.token_ids.clone(), &s.limits, s.next_seed())?;
    let out = s.run(gen_req).await?;
    let request_id = req.request_id.unwrap_or_else(|| format!("gen-{:016x}", s.next_seed()));
    Ok(Json(body(&s, &request_id, &req.token_ids, &req.sampling, &out)))
}

/// The response as vLLM's `GenerateResponse`, with the server's usage and weights version besides.
fn body(s: &AppState, request_id: &str, prompt: &[u32], sampling: &Sampling, out: &GenOutput) -> Value {
    let choices: Vec<Value> = out
        .completions
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let logprobs = if sampling.wants_logprobs() {
                json!({"content": c.logprobs.iter().map(token_entry).collect::<Vec<_>>()})
            } else {
                Value::Null
            };
            json!({"index": i, "token_ids": c.token_ids, "logprobs": logprobs, "finish_reason": finish_reason(c, false)})
        })
        .collect();
    let mut body = json!({
        "request_id": request_id,
        "choices": choices,
        "prompt_token_ids": prompt,
        "usage": usage(prompt.len(), out),
        "weights_version": out.weights_version,
    });
    if sampling.prompt_logprobs.is_some() {
        body["prompt_logprobs"] = s.prompt_logprobs_json(out);
    }
    body
}

/// One sampled token as vLLM writes it with `return_tokens_as_token_ids`: `token_id:<id>`.
fn token_entry(t: &TokenLogprob) -> Value {
    let top: Vec<Value> =
        t.top.iter().map(|(id, lp)| json!({"token": format!("token_id:{id}"), "logprob": lp})).collect();
    json!({"token": format!("token_id:{}", t.id), "logprob": t.logprob, "top_logprobs": top})
}
