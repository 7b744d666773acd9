//! Typed clients of the OpenAI-compatible model endpoints the orchestrator talks to — the policy's
//! inference server and every `models.<key>` entry: health, weight updates, `/tokenize` and token
//! scoring (`prompt_logprobs` on `/v1/completions`). The one place that builds these requests.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use rl_configs::{ModelConfig, OrchestratorConfig, POLICY_KEY};
use serde_json::{Value, json};

use crate::error::{Error, Result};

/// An OpenAI-compatible endpoint (the policy or a `models.<key>` entry).
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
    /// Bearer token for its routes.
    pub api_key: Option<rl_serve::ApiKey>,
    /// Bearer token for its admin routes (`/update_weights`), when it differs from `api_key`.
    pub admin_key: Option<rl_serve::ApiKey>,
    /// Extra headers on every request.
    pub headers: BTreeMap<String, String>,
    /// The policy's adapters are loaded under this name through vLLM's LoRA API.
    pub lora_name: Option<String>,
    /// Every replica's base URL (the policy's; others have just `base_url`).
    pub replicas: Vec<String>,
}

impl Endpoint {
    /// The model name requests carry while the server holds policy `version`: the adapter's name
    /// once one is loaded through vLLM's LoRA API (version 0 is the base, served as `model`).
    pub fn model_at(&self, version: u64) -> &str {
        match &self.lora_name {
            Some(lora) if version > 0 => lora,
            _ => &self.model,
        }
    }

    /// The server root (admin and `/tokenize` routes live there, beside `/v1`).
    pub fn root(&self) -> String {
        root_url(&self.base_url)
    }
}

/// Retries of a weight update after a 5xx answer or a transport error.
const ADMIN_RETRIES: u32 = 5;

/// The key in the environment variable a config key names (none when the key is unset).
fn secret(key: &str, var: Option<&str>) -> Result<Option<rl_serve::ApiKey>> {
    var.map(|v| {
        rl_configs::secret_from_env(&format!("orchestrator.{key}"), v)
            .map(rl_serve::ApiKey)
            .map_err(|e| Error::Config(e.to_string()))
    })
    .transpose()
}

/// Adds the bearer token, if any.
fn authorized(request: reqwest::RequestBuilder, key: Option<&rl_serve::ApiKey>) -> reqwest::RequestBuilder {
    match key {
        Some(k) => request.bearer_auth(&k.0),
        None => request,
    }
}

/// Adds the endpoint's extra headers.
fn with_headers(mut request: reqwest::RequestBuilder, ep: &Endpoint) -> reqwest::RequestBuilder {
    for (name, value) in &ep.headers {
        request = request.header(name, value);
    }
    request
}

/// `a`, `b` (or "nothing").
fn quoted(names: &[String]) -> String {
    if names.is_empty() {
        return String::from("nothing");
    }
    names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
}

/// `http://host:port` of a `.../v1` base URL.
pub fn root_url(base_url: &str) -> String {
    base_url.trim_end_matches('/').trim_end_matches("/v1").to_owned()
}

/// The endpoints of a run by key (`policy` and each `models.<key>`), with one HTTP client.
#[derive(Debug, Clone)]
pub struct Models {
    http: reqwest::Client,
    endpoints: BTreeMap<String, Endpoint>,
}

impl Models {
    /// The endpoints a config names.
    pub fn new(cfg: &OrchestratorConfig) -> Result<Self> {
        let http = rl_serve::http::client_builder(&[])
            .timeout(Duration::from_secs_f64(cfg.model.timeout_s))
            .build()
            .map_err(|e| Error::Config(format!("cannot build the HTTP client: {e}")))?;
        let mut endpoints = BTreeMap::new();
        let policy = ModelConfig { path: cfg.model.path.clone(), name: cfg.model.name.clone() };
        endpoints.insert(
            POLICY_KEY.to_owned(),
            Endpoint {
                base_url: cfg.model.base_url.first().to_owned(),
                model: policy.served_name(),
                tokens: true,
                timeout: Duration::from_secs_f64(cfg.model.timeout_s),
                api_key: secret("model.api_key_env", cfg.model.api_key_env.as_deref())?,
                admin_key: secret("model.admin_key_env", cfg.model.admin_key_env.as_deref())?,
                headers: cfg.model.headers.clone(),
                lora_name: cfg.model.lora_name.clone(),
                replicas: cfg.model.base_url.all().to_vec(),
            },
        );
        for (key, m) in &cfg.models {
            endpoints.insert(
                key.clone(),
                Endpoint {
                    base_url: m.base_url.clone(),
                    model: m.name.clone(),
                    tokens: m.tokens,
                    timeout: Duration::from_secs_f64(m.timeout_s),
                    api_key: secret(&format!("models.{key}.api_key_env"), m.api_key_env.as_deref())?,
                    admin_key: None,
                    headers: m.headers.clone(),
                    lora_name: None,
                    replicas: vec![m.base_url.clone()],
                },
            );
        }
        for (key, ep) in &endpoints {
            for url in &ep.replicas {
                rl_serve::http::check_reachable_scheme(url)
                    .map_err(|m| Error::Config(format!("{key} ({url}): {m}")))?;
            }
        }
        Ok(Models { http, endpoints })
    }

    /// The endpoints by key.
    pub fn endpoints(&self) -> &BTreeMap<String, Endpoint> {
        &self.endpoints
    }

    /// The endpoint of `key`.
    pub fn endpoint(&self, key: &str) -> Result<&Endpoint> {
        self.endpoints.get(key).ok_or_else(|| Error::Config(format!("no model `{key}` is configured")))
    }

    /// Waits until every replica of `key` answers `/health` with 200, at most `wait` in all.
    pub async fn wait_healthy(&self, key: &str, wait: Duration) -> Result<()> {
        let start = Instant::now();
        for url in &self.endpoint(key)?.replicas {
            let health = format!("{}/health", root_url(url));
            let mut said = false;
            loop {
                match self.http.get(&health).send().await {
                    Ok(r) if r.status().is_success() => break,
                    // Said once: a server still loading is normal, a silent wait of minutes is not.
                    _ if !said => {
                        said = true;
                        tracing::info!(
                            "waiting for the policy server at {health} (at most {wait:?}: wait_for_ready_s)"
                        );
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    other if start.elapsed() > wait => {
                        let why = other.map_or_else(|e| e.to_string(), |r| r.status().to_string());
                        let message = format!("not healthy after {wait:?}: {why}");
                        return Err(Error::Policy { url: health, message });
                    }
                    _ => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        }
        Ok(())
    }

    /// Settles the policy's model name against what its server lists at `/v1/models`. `configured`
    /// false (neither `model.name` nor `model.path`): the one model listed, as `vf-eval` users
    /// expect (several, as vLLM lists with LoRA adapters, need `model.name`). Configured: a name
    /// the server does not list (vLLM's `--served-model-name` is not the directory's name, say)
    /// would have every request refused, so it stops the start here, naming what is served. A
    /// server without the route (not every OpenAI-compatible one has it) is taken at its word.
    pub async fn settle_policy_name(&mut self, configured: bool) -> Result<()> {
        let http = self.http.clone();
        let ep = self
            .endpoints
            .get_mut(POLICY_KEY)
            .ok_or_else(|| Error::Config(String::from("no policy endpoint is configured")))?;
        let url = format!("{}/models", ep.base_url.trim_end_matches('/'));
        let fail = |message: String| Error::Policy { url: url.clone(), message };
        let listed = async {
            let request = with_headers(authorized(http.get(&url), ep.api_key.as_ref()), ep);
            let resp = request.send().await.map_err(|e| e.to_string())?;
            let status = resp.status();
            let body: Value = resp.json().await.map_err(|e| format!("{status}: not JSON: {e}"))?;
            if !status.is_success() {
                return Err(format!("{status}: {body}"));
            }
            let ids = body["data"].as_array().into_iter().flatten().filter_map(|m| m["id"].as_str());
            Ok::<Vec<String>, String>(ids.map(str::to_owned).collect())
        }
        .await;
        let ids = match listed {
            Ok(ids) => ids,
            Err(why) if configured => {
                tracing::debug!("{url} does not list the served models ({why}): requests name `{}`", ep.model);
                return Ok(());
            }
            Err(why) => {
                return Err(fail(format!("model.name is not set and the served models cannot be listed: {why}")));
            }
        };
        match &ids[..] {
            _ if configured && (ids.is_empty() || ids.contains(&ep.model)) => Ok(()),
            [one] if !configured => {
                tracing::info!("model.name is not set: using `{one}`, the model {url} serves");
                ep.model.clone_from(one);
                Ok(())
            }
            _ if configured => Err(fail(format!(
                "the server does not serve `{}` (it serves {}): set model.name to the name it serves",
                ep.model,
                quoted(&ids)
            ))),
            _ => Err(fail(format!(
                "model.name is not set (nor model.path) and the server lists {} models ({}): set model.name",
                ids.len(),
                quoted(&ids)
            ))),
        }
    }

    /// `/health` of the policy server at `base_url`: `None` when it does not answer 200, else its
    /// `boot_id` (changes when it restarts; empty for servers that report none, such as vLLM).
    pub async fn policy_health(&self, base_url: &str) -> Option<String> {
        let health = format!("{}/health", root_url(base_url));
        let r = self.http.get(&health).timeout(Duration::from_secs(5)).send().await.ok()?;
        let r = r.error_for_status().ok()?;
        let v: Value = r.json().await.unwrap_or(Value::Null);
        Some(v.get("boot_id").and_then(Value::as_str).unwrap_or_default().to_owned())
    }

    /// Tells the policy's server to load the weights in `dir`: `/update_weights` (`rl inference`,
    /// `python -m rl_env.vllm_server`, prime-rl's server), or with `lora_name` vLLM's LoRA API,
    /// replacing the adapter of that name in place.
    /// `base_url` is the replica's.
    pub async fn update_weights(&self, base_url: &str, dir: &Path) -> Result<()> {
        let policy = self.endpoint(POLICY_KEY)?;
        let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_owned());
        match &policy.lora_name {
            None => {
                let url = format!("{}/update_weights", root_url(base_url));
                // Plain `vllm serve` has no such route.
                let hint = " (the server has no /update_weights route: serve vLLM with `python -m \
                            rl_env.vllm_server`, see docs/guide-vllm.md)";
                self.admin_post(&url, &json!({"weight_dir": dir}), hint).await
            }
            Some(name) => {
                let url = format!("{}/load_lora_adapter", base_url.trim_end_matches('/'));
                // vLLM serves the route only with runtime LoRA updates allowed.
                let hint = " (vLLM serves this route only when started with \
                            VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora, see docs/guide-vllm.md)";
                let body = json!({"lora_name": name, "lora_path": dir, "load_inplace": true});
                self.admin_post(&url, &body, hint).await
            }
        }
    }

    /// Posts an admin request to the policy's server. As prime-rl's admin client: 5xx answers and
    /// transport errors are retried (backoff 1, 2, 4, 8, 10 s), 4xx answers are not; a 404 gets
    /// `hint_404` appended.
    async fn admin_post(&self, url: &str, body: &Value, hint_404: &str) -> Result<()> {
        let policy = self.endpoint(POLICY_KEY)?;
        let route = url.rsplit('/').next().unwrap_or(url);
        let fail = |message: String| Error::Policy { url: url.to_owned(), message };
        let mut attempt = 0u32;
        loop {
            let request = with_headers(self.http.post(url).json(body), policy);
            let key = policy.admin_key.as_ref().or(policy.api_key.as_ref());
            let (why, retryable) = match authorized(request, key).send().await {
                Ok(r) if r.status().is_success() => return Ok(()),
                Ok(r) => {
                    let status = r.status();
                    let text = r.text().await.unwrap_or_default();
                    let hint = if status == reqwest::StatusCode::NOT_FOUND { hint_404 } else { "" };
                    (format!("{route} answered {status}: {text}{hint}"), status.is_server_error())
                }
                Err(e) => (e.to_string(), true),
            };
            if !retryable || attempt >= ADMIN_RETRIES {
                return Err(fail(why));
            }
            let pause = Duration::from_secs((1u64 << attempt).min(10));
            tracing::warn!(attempt, reason = %why, ?pause, "weight update failed; trying again");
            tokio::time::sleep(pause).await;
            attempt += 1;
        }
    }

    async fn post(&self, key: &str, url: String, body: Value) -> Result<Value> {
        let ep = self.endpoint(key)?;
        let fail = |message: String| Error::Scoring { model: key.to_owned(), url: url.clone(), message };
        let request = with_headers(self.http.post(&url).timeout(ep.timeout).json(&body), ep);
        let resp = authorized(request, ep.api_key.as_ref()).send().await.map_err(|e| fail(e.to_string()))?;
        let status = resp.status();
        let text = resp.text().await.map_err(|e| fail(e.to_string()))?;
        if !status.is_success() {
            return Err(fail(format!("answered {status}: {}", text.chars().take(300).collect::<String>())));
        }
        serde_json::from_str(&text).map_err(|e| fail(format!("invalid JSON: {e}")))
    }

    /// Logprob of every token of `ids` given the tokens before it (the first token gets 0).
    /// `policy_version` (requests to the policy) is their `cache_salt`, which keeps prefix-cache
    /// entries of one version apart from another's, and picks the model name (the base or its adapter).
    /// `server` overrides the endpoint's base URL (the policy replica picked for the group).
    pub async fn score(
        &self,
        key: &str,
        ids: &[u32],
        policy_version: Option<u64>,
        server: Option<&str>,
    ) -> Result<Vec<f32>> {
        let ep = self.endpoint(key)?;
        let url = format!("{}/completions", server.unwrap_or(&ep.base_url).trim_end_matches('/'));
        let model = policy_version.map_or(ep.model.as_str(), |v| ep.model_at(v));
        let mut body =
            json!({"model": model, "prompt": ids, "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0});
        if let Some(version) = policy_version {
            body["cache_salt"] = json!(version.to_string());
        }
        let resp = self.post(key, url.clone(), body).await?;
        let fail = |message: String| Error::Scoring { model: key.to_owned(), url: url.clone(), message };
        let items = resp
            .get("prompt_logprobs")
            .filter(|v| !v.is_null())
            .or_else(|| resp.pointer("/choices/0/prompt_logprobs"))
            .and_then(Value::as_array)
            .ok_or_else(|| {
                fail(String::from("the answer has no `prompt_logprobs` (does the server support scoring?)"))
            })?;
        if items.len() != ids.len() {
            return Err(fail(format!("{} prompt logprobs for {} tokens", items.len(), ids.len())));
        }
        let mut out = Vec::with_capacity(ids.len());
        for (i, (item, id)) in items.iter().zip(ids).enumerate() {
            if i == 0 {
                out.push(0.0);
                continue;
            }
            let lp = item
                .get(id.to_string())
                .and_then(|e| e["logprob"].as_f64())
                .ok_or_else(|| fail(format!("prompt_logprobs[{i}] has no entry for token {id}")))?;
            out.push(lp as f32);
        }
        Ok(out)
    }

    /// Token ids of `messages` rendered by the model's chat template (no generation prompt).
    pub async fn tokenize(&self, key: &str, messages: Value) -> Result<Vec<u32>> {
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
