//! Algorithms that need more than the traces: `opd` and `opsd` score branch tokens with a model
//! (`prompt_logprobs` on `/v1/completions`, at most `max_concurrent` requests in flight), and
//! env-owned algorithms run on the env's server through `RunAlgorithms`.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use futures::StreamExt;
use rl_configs::LossChannel;
use rl_serve::{EnvClient, branches, pb};
use serde_json::{Value, json};

use crate::algorithms::{Algorithm, Channel};
use crate::error::{Error, Result};

/// An OpenAI-compatible endpoint the orchestrator talks to (the policy or a `models.<key>` entry).
#[derive(Debug, Clone, PartialEq)]
pub struct Endpoint {
    /// Base URL ending in `/v1`.
    pub base_url: String,
    /// Model name sent in requests.
    pub model: String,
    /// Returns and scores token ids.
    pub tokens: bool,
    /// Per-request timeout.
    pub timeout: Duration,
}

impl Endpoint {
    /// The server root (admin and `/tokenize` routes live there, beside `/v1`).
    pub fn root(&self) -> String {
        root_url(&self.base_url)
    }
}

/// `http://host:port` of a `.../v1` base URL.
pub fn root_url(base_url: &str) -> String {
    base_url.trim_end_matches('/').trim_end_matches("/v1").to_owned()
}

/// What the model-backed algorithms need: an HTTP client, the endpoints by key, the env's server.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ScoringContext<'a> {
    pub(crate) http: &'a reqwest::Client,
    pub(crate) endpoints: &'a BTreeMap<String, Endpoint>,
    pub(crate) env: &'a EnvClient,
    pub(crate) runtimes: &'a BTreeMap<String, pb::ModelRuntime>,
}

impl ScoringContext<'_> {
    fn endpoint(&self, key: &str) -> Result<&Endpoint> {
        self.endpoints.get(key).ok_or_else(|| Error::Config(format!("no model `{key}` is configured")))
    }

    async fn post(&self, key: &str, url: String, body: Value) -> Result<Value> {
        let ep = self.endpoint(key)?;
        let fail = |message: String| Error::Scoring { model: key.to_owned(), url: url.clone(), message };
        let resp =
            self.http.post(&url).timeout(ep.timeout).json(&body).send().await.map_err(|e| fail(e.to_string()))?;
        let status = resp.status();
        let text = resp.text().await.map_err(|e| fail(e.to_string()))?;
        if !status.is_success() {
            return Err(fail(format!("answered {status}: {}", text.chars().take(300).collect::<String>())));
        }
        serde_json::from_str(&text).map_err(|e| fail(format!("invalid JSON: {e}")))
    }

    /// Logprob of every token of `ids` given the tokens before it (the first token gets 0).
    pub(crate) async fn score(&self, key: &str, ids: &[u32]) -> Result<Vec<f32>> {
        let ep = self.endpoint(key)?;
        let url = format!("{}/completions", ep.base_url.trim_end_matches('/'));
        let body = json!({"model": ep.model, "prompt": ids, "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0});
        let resp = self.post(key, url.clone(), body).await?;
        let items = resp
            .get("prompt_logprobs")
            .filter(|v| !v.is_null())
            .or_else(|| resp.pointer("/choices/0/prompt_logprobs"))
            .and_then(Value::as_array)
            .ok_or_else(|| Error::Scoring {
                model: key.to_owned(),
                url: url.clone(),
                message: String::from("the answer has no `prompt_logprobs` (does the server support scoring?)"),
            })?;
        if items.len() != ids.len() {
            return Err(Error::Scoring {
                model: key.to_owned(),
                url,
                message: format!("{} prompt logprobs for {} tokens", items.len(), ids.len()),
            });
        }
        let mut out = Vec::with_capacity(ids.len());
        for (i, (item, id)) in items.iter().zip(ids).enumerate() {
            if i == 0 {
                out.push(0.0);
                continue;
            }
            let lp = item.get(id.to_string()).and_then(|e| e["logprob"].as_f64()).ok_or_else(|| Error::Scoring {
                model: key.to_owned(),
                url: url.clone(),
                message: format!("prompt_logprobs[{i}] has no entry for token {id}"),
            })?;
            out.push(lp as f32);
        }
        Ok(out)
    }

    /// Token ids of `messages` rendered by the model's chat template (no generation prompt).
    pub(crate) async fn tokenize(&self, key: &str, messages: Value) -> Result<Vec<u32>> {
        let ep = self.endpoint(key)?;
        let url = format!("{}/tokenize", ep.root());
        let body = json!({"model": ep.model, "messages": messages, "add_generation_prompt": false});
        let resp = self.post(key, url.clone(), body).await?;
        resp["tokens"]
            .as_array()
            .and_then(|a| a.iter().map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok())).collect::<Option<Vec<_>>>())
            .ok_or_else(|| Error::Scoring { model: key.to_owned(), url, message: String::from("no `tokens` list") })
    }
}

/// Channels of a model-scored or env-owned algorithm for one group.
pub(crate) async fn remote_channels(
    algorithm: &Algorithm,
    traces: &[pb::Trace],
    ctx: ScoringContext<'_>,
) -> Result<Vec<Vec<Channel>>> {
    match algorithm {
        Algorithm::Opd { model, max_concurrent } => {
            distill(traces, ctx, model, *max_concurrent, |_| Ok(Vec::new())).await
        }
        Algorithm::Opsd { model, demo_key, template, max_concurrent } => {
            // One hint per distinct demonstration (a group shares its task).
            let mut hints: HashMap<String, Vec<u32>> = HashMap::new();
            for t in traces.iter().filter(|t| t.errors.is_empty()) {
                let demo = demonstration(t, demo_key)?;
                if let std::collections::hash_map::Entry::Vacant(slot) = hints.entry(demo) {
                    let hint = template.replace("{demonstration}", slot.key());
                    let ids = ctx.tokenize(model, json!([{"role": "system", "content": hint}])).await?;
                    slot.insert(ids);
                }
            }
            distill(traces, ctx, model, *max_concurrent, |t| {
                Ok(hints.get(&demonstration(t, demo_key)?).cloned().unwrap_or_default())
            })
            .await
        }
        Algorithm::EnvOwned { id, fields_json } => env_owned(id, fields_json, traces, ctx).await,
        local => Ok(local.local_channels(traces).unwrap_or_default()),
    }
}

/// The demonstration of a trace's task (`task_json[demo_key]`, a string or any JSON value).
fn demonstration(trace: &pb::Trace, demo_key: &str) -> Result<String> {
    let task: Value = serde_json::from_str(&trace.task_json).unwrap_or(Value::Null);
    match task.get(demo_key) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(v) if !v.is_null() => Ok(v.to_string()),
        _ => Err(Error::Config(format!(
            "opsd: the task has no `{demo_key}` field to use as the demonstration (set `demo_key`; task fields: {})",
            task.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>().join(", ")).unwrap_or_default()
        ))),
    }
}

/// Per-token advantage `teacher logprob - inference logprob` on sampled tokens, the teacher
/// scoring `prefix(trace) + branch tokens` (the prefix's positions are dropped).
async fn distill(
    traces: &[pb::Trace],
    ctx: ScoringContext<'_>,
    model: &str,
    max_concurrent: usize,
    prefix: impl Fn(&pb::Trace) -> Result<Vec<u32>>,
) -> Result<Vec<Vec<Channel>>> {
    let mut jobs = Vec::new();
    for (t, trace) in traces.iter().enumerate() {
        if !trace.errors.is_empty() {
            continue;
        }
        let pre = prefix(trace)?;
        for (b, branch) in branches(trace).into_iter().enumerate() {
            jobs.push((t, b, pre.clone(), branch));
        }
    }
    let scored: Vec<Result<(usize, Channel)>> = futures::stream::iter(jobs)
        .map(|(t, b, pre, branch)| async move {
            let ids: Vec<u32> = pre.iter().chain(&branch.token_ids).copied().collect();
            let teacher = ctx.score(model, &ids).await?;
            let teacher = &teacher[pre.len()..];
            let values = branch
                .mask
                .iter()
                .zip(teacher.iter().zip(&branch.logprobs))
                .map(|(m, (tl, l))| if *m { tl - l } else { 0.0 })
                .collect();
            Ok((t, Channel { branch: b, loss: LossChannel::Rl, values, mask: branch.mask }))
        })
        .buffered(max_concurrent.max(1))
        .collect()
        .await;
    let mut out = vec![Vec::new(); traces.len()];
    for r in scored {
        let (t, ch) = r?;
        out[t].push(ch);
    }
    Ok(out)
}

async fn env_owned(
    id: &str,
    fields_json: &str,
    traces: &[pb::Trace],
    ctx: ScoringContext<'_>,
) -> Result<Vec<Vec<Channel>>> {
    let req = pb::RunAlgorithmsRequest {
        algorithms: vec![pb::AlgorithmSpec { id: id.to_owned(), fields_json: fields_json.to_owned() }],
        traces: traces.to_vec(),
        models: ctx.runtimes.clone().into_iter().collect(),
    };
    let resp = ctx.env.run_algorithms(req).await?;
    if resp.traces.len() != traces.len() {
        return Err(Error::Config(format!(
            "env-owned algorithm `{id}` answered for {} traces, sent {}",
            resp.traces.len(),
            traces.len()
        )));
    }
    resp.traces
        .into_iter()
        .map(|t| {
            t.branches
                .into_iter()
                .map(|b| {
                    let loss = match pb::LossChannel::try_from(b.loss) {
                        Ok(pb::LossChannel::Rl) => LossChannel::Rl,
                        Ok(pb::LossChannel::Ce) => LossChannel::Ce,
                        _ => {
                            return Err(Error::Config(format!(
                                "env-owned algorithm `{id}` returned a branch without a loss channel"
                            )));
                        }
                    };
                    Ok(Channel { branch: b.branch_index as usize, loss, values: b.advantages, mask: b.mask })
                })
                .collect()
        })
        .collect()
}
