//! The shared state of the HTTP layer (the engine, tokenizer, limits, counters) and the response
//! pieces every route builds: usage, finish reasons, token and prompt logprobs.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rl_model::{ChatTemplate, Tok};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::api::{Limits, Sampling};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::generation::{Completion, Finish, GenOutput, GenRequest, TokenLogprob};
use crate::tool_calls::CallFormat;

/// Shared state of the HTTP layer (the engine owns all model state).
#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) engine: Engine,
    pub(crate) tok: Arc<Tok>,
    pub(crate) template: Arc<ChatTemplate>,
    pub(crate) limits: Limits,
    pub(crate) pending: Arc<Semaphore>,
    pub(crate) timeout: Duration,
    pub(crate) stuck_after: Duration,
    pub(crate) weight_roots: Arc<Vec<PathBuf>>,
    /// How the model writes tool calls (`None`: replies are not parsed for calls).
    pub(crate) tool_format: Option<CallFormat>,
    /// How a thinking model's replies split into reasoning and content (`None`: they do not).
    pub(crate) reasoning: Option<crate::reasoning::ReasoningParser>,
    pub(crate) counter: Arc<AtomicU64>,
    /// Differs between two runs of the server: a client that sees it change knows the server
    /// restarted with its starting weights.
    pub(crate) boot_id: Arc<str>,
    /// Request and token counters (`/metrics`).
    pub(crate) stats: Arc<crate::stats::Stats>,
    /// Unix time the server started (`created` of `/v1/models`).
    pub(crate) started: u64,
}

impl AppState {
    /// Token ids of a prompt, refusing text that cannot fit the context before tokenizing it (a
    /// megabytes-long prompt would otherwise cost gigabytes of tokenizer memory first).
    pub(crate) fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let at_least = self.tok.min_tokens(text);
        if at_least >= self.limits.max_model_len {
            return Err(Error::BadRequest(format!(
                "This model's maximum context length is {} tokens. However, the prompt ({} bytes) has at least {at_least} tokens.",
                self.limits.max_model_len,
                text.len()
            )));
        }
        Ok(self.tok.encode(text)?)
    }

    /// Runs a request through the engine within the pending-request bound and the timeout.
    pub(crate) async fn run(&self, req: GenRequest) -> Result<GenOutput> {
        let _permit = self
            .pending
            .clone()
            .try_acquire_owned()
            .map_err(|_| Error::Overloaded(String::from("too many pending requests; retry later")))?;
        let prompt_len = req.prompt.len();
        let result = match tokio::time::timeout(self.timeout, self.engine.generate(req)).await {
            Ok(result) => result,
            Err(_) => Err(Error::Timeout(format!("request took longer than {:?}", self.timeout))),
        };
        self.stats.record(prompt_len, &result);
        result
    }

    pub(crate) fn next_seed(&self) -> u64 {
        self.counter.fetch_add(1, Ordering::Relaxed).wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }

    /// The response envelope shared by chat and text completions (ids, usage, vLLM extensions).
    pub(crate) fn response_body(
        &self,
        id: &str,
        object: &str,
        choices: Vec<Value>,
        prompt: &[u32],
        out: &GenOutput,
        sampling: &Sampling,
    ) -> Value {
        let mut body = json!({
            "id": format!("{id}-{}", self.next_seed()),
            "object": object,
            "created": now(),
            "model": self.limits.model_name,
            "choices": Value::Array(choices),
            "usage": usage(prompt.len(), out),
            "weights_version": out.weights_version,
        });
        if sampling.return_token_ids {
            body["prompt_token_ids"] = json!(prompt);
        }
        if sampling.prompt_logprobs.is_some() {
            body["prompt_logprobs"] = self.prompt_logprobs_json(out);
        }
        body
    }

    pub(crate) fn token_json(&self, t: &TokenLogprob) -> Value {
        let text = self.tok.decode(&[t.id]).unwrap_or_default();
        let top: Vec<Value> = t
            .top
            .iter()
            .map(|(id, lp)| {
                let s = self.tok.decode(&[*id]).unwrap_or_default();
                json!({"token": s, "logprob": lp, "bytes": s.as_bytes()})
            })
            .collect();
        json!({"token": text, "logprob": t.logprob, "bytes": text.as_bytes(), "top_logprobs": top})
    }

    pub(crate) fn prompt_logprobs_json(&self, out: &GenOutput) -> Value {
        match &out.prompt_logprobs {
            None => Value::Null,
            Some(items) => Value::Array(
                items
                    .iter()
                    .map(|item| match item {
                        None => Value::Null,
                        Some(t) => {
                            let mut m = serde_json::Map::new();
                            m.insert(t.id.to_string(), json!({"logprob": t.logprob, "rank": rank(t), "decoded_token": self.tok.decode(&[t.id]).unwrap_or_default()}));
                            for (i, (id, lp)) in t.top.iter().enumerate() {
                                m.entry(id.to_string()).or_insert_with(|| {
                                    json!({"logprob": lp, "rank": i + 1, "decoded_token": self.tok.decode(&[*id]).unwrap_or_default()})
                                });
                            }
                            Value::Object(m)
                        }
                    })
                    .collect(),
            ),
        }
    }
}

fn rank(t: &TokenLogprob) -> usize {
    t.top.iter().position(|(id, _)| *id == t.id).map_or(t.top.len() + 1, |p| p + 1)
}

pub(crate) fn finish_reason(c: &Completion, has_calls: bool) -> &'static str {
    match (c.finish, has_calls) {
        (Finish::Length, _) => "length",
        (Finish::Stop, true) => "tool_calls",
        (Finish::Stop, false) => "stop",
    }
}

pub(crate) fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

pub(crate) fn usage(prompt: usize, out: &GenOutput) -> Value {
    let completion: usize = out.completions.iter().map(|c| c.token_ids.len()).sum();
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
           "prompt_tokens_details": {"cached_tokens": out.cached_tokens}})
}
