//! Domain types of environments: chat messages, tools, tasks, model runtimes, training context,
//! and their conversion from the wire (validated, with the field at fault named).

use std::collections::BTreeMap;
use std::time::Duration;

use rl_configs::Temperature;
use rl_proto::env::v1 as pb;
use serde_json::Value;

use crate::error::{Error, Result};

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Instructions.
    System,
    /// The user or the environment.
    User,
    /// The model.
    Assistant,
    /// A tool result.
    Tool,
}

impl Role {
    /// The OpenAI role name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }

    /// Parses an OpenAI role name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "system" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            _ => return None,
        })
    }
}

/// A function call made by the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// Call id.
    pub id: String,
    /// Tool name.
    pub name: String,
    /// Arguments, JSON text.
    pub arguments: String,
}

/// One chat message.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// Author.
    pub role: Role,
    /// Text.
    pub content: String,
    /// Calls made by an assistant message.
    pub tool_calls: Vec<ToolCall>,
    /// For a tool message: the call answered.
    pub tool_call_id: Option<String>,
}

impl Message {
    /// A message with only text.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Message { role, content: content.into(), tool_calls: Vec::new(), tool_call_id: None }
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Message::new(Role::System, content)
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Message::new(Role::User, content)
    }

    /// An assistant message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Message::new(Role::Assistant, content)
    }

    /// A tool result answering `call_id`.
    pub fn tool(call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Message { tool_call_id: Some(call_id.into()), ..Message::new(Role::Tool, content) }
    }
}

impl Message {
    /// The OpenAI chat form: `{"role", "content", "tool_calls"?, "tool_call_id"?}`.
    pub fn to_json(&self) -> Value {
        let mut v = serde_json::json!({"role": self.role.as_str(), "content": self.content});
        if !self.tool_calls.is_empty() {
            v["tool_calls"] = Value::Array(
                self.tool_calls
                    .iter()
                    .map(|c| {
                        serde_json::json!({"id": c.id, "type": "function",
                            "function": {"name": c.name, "arguments": c.arguments}})
                    })
                    .collect(),
            );
        }
        if let Some(id) = &self.tool_call_id {
            v["tool_call_id"] = Value::String(id.clone());
        }
        v
    }

    /// Parses the OpenAI chat form; `field` names the message in errors (a `BadRequest`).
    pub fn from_json(v: &Value, field: &str) -> Result<Message> {
        let bad = |what: &str, msg: String| Error::bad_request(format!("{field}{what}"), msg);
        let obj = v.as_object().ok_or_else(|| bad("", String::from("must be a message object")))?;
        let role = obj.get("role").and_then(Value::as_str).unwrap_or_default();
        let role = Role::parse(role)
            .ok_or_else(|| bad(".role", format!("must be system, user, assistant or tool, got {role:?}")))?;
        let content = match obj.get("content") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(bad(".content", String::from("must be a string"))),
        };
        let tool_calls = tool_calls_of(v).map_err(|e| bad("", e))?;
        let tool_call_id = obj.get("tool_call_id").and_then(Value::as_str).map(str::to_owned);
        if role == Role::Tool && tool_call_id.is_none() {
            return Err(bad(".tool_call_id", String::from("a tool message must answer a call")));
        }
        Ok(Message { role, content, tool_calls, tool_call_id })
    }
}

/// The `tool_calls` of an OpenAI message (none when absent); an error says which call is malformed.
pub(crate) fn tool_calls_of(msg: &Value) -> std::result::Result<Vec<ToolCall>, String> {
    let calls = match msg.get("tool_calls") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(calls)) => calls,
        Some(_) => return Err(String::from(".tool_calls must be a list")),
    };
    calls
        .iter()
        .enumerate()
        .map(|(j, c)| {
            let f = c.get("function").ok_or_else(|| format!(".tool_calls[{j}] has no `function`"))?;
            Ok(ToolCall {
                id: c.get("id").and_then(Value::as_str).unwrap_or("").to_owned(),
                name: f.get("name").and_then(Value::as_str).unwrap_or("").to_owned(),
                arguments: match f.get("arguments") {
                    Some(Value::String(s)) => s.clone(),
                    Some(other) => other.to_string(),
                    None => String::from("{}"),
                },
            })
        })
        .collect()
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// Name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// JSON Schema of the arguments.
    pub parameters: Value,
}

impl ToolSpec {
    /// The OpenAI form a chat request (and a chat template) takes:
    /// `{"type": "function", "function": {"name", "description", "parameters"}}`.
    pub fn to_json(&self) -> Value {
        serde_json::json!({"type": "function", "function": {"name": self.name, "description": self.description, "parameters": self.parameters}})
    }
}

/// One task: its key and the env's task data.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// `<split>/<index>` or `inline`.
    pub key: String,
    /// Task data in the env's format.
    pub data: Value,
}

/// Training progress, given to the scoring of one request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TrainingContext {
    /// Orchestrator step (1-indexed).
    pub step: u64,
    /// Latest checkpoint step.
    pub ckpt_step: u64,
    /// Policy version (0-indexed).
    pub policy_version: u64,
    /// Anything else.
    pub extra: BTreeMap<String, Value>,
}

impl TrainingContext {
    /// Decodes the wire form (`extra` values are JSON text; plain text is kept as a string).
    pub fn from_wire(c: &pb::TrainingContext) -> Self {
        let extra = c
            .extra
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.clone()))))
            .collect();
        TrainingContext { step: c.step, ckpt_step: c.ckpt_step, policy_version: c.policy_version, extra }
    }
}

/// A request's training context, decoded once where the request arrives; the wire form is kept
/// as it came, to be echoed back on the traces (`Trace.scored_with`).
#[derive(Debug, Clone, PartialEq)]
pub struct RequestContext {
    /// The decoded context scoring reads.
    pub decoded: TrainingContext,
    /// The context as the request carried it.
    pub wire: pb::TrainingContext,
}

impl RequestContext {
    /// Decodes `wire`, keeping it.
    pub fn from_wire(wire: pb::TrainingContext) -> Self {
        RequestContext { decoded: TrainingContext::from_wire(&wire), wire }
    }
}

/// Sampling arguments of model calls.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sampling {
    /// Temperature.
    pub temperature: Option<Temperature>,
    /// Nucleus threshold.
    pub top_p: Option<f64>,
    /// Top-k.
    pub top_k: Option<i64>,
    /// Most tokens per turn.
    pub max_completion_tokens: Option<u32>,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Base seed.
    pub seed: Option<u64>,
    /// Extra request-body fields.
    pub extra: serde_json::Map<String, Value>,
}

impl Sampling {
    /// Fields a vLLM-style server fills from the model's `generation_config.json` when a request
    /// leaves them out (vLLM's default `--generation-config auto`: Qwen3 then samples with top_k
    /// 20 and top_p 0.95, Qwen2.5 with a repetition penalty of 1.05), each with the value that
    /// leaves the distribution alone. A trained actor's requests state every one its sampling
    /// does not set, so the engine samples softmax(z / T), the distribution the trainer computes.
    pub fn state_neutral_fields(body: &mut serde_json::Map<String, Value>) {
        let neutral = [
            ("top_p", serde_json::json!(1.0)),
            ("top_k", serde_json::json!(-1)),
            ("min_p", serde_json::json!(0.0)),
            ("repetition_penalty", serde_json::json!(1.0)),
        ];
        for (key, value) in neutral {
            body.entry(key).or_insert(value);
        }
    }
}

/// A model endpoint and how to sample from it.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelRuntime {
    /// OpenAI base URL (`.../v1`).
    pub base_url: String,
    /// Model name.
    pub model: String,
    /// Sampling arguments.
    pub sampling: Sampling,
    /// Token ids and logprobs are required.
    pub tokens: bool,
    /// Prefix-cache salt (the policy version).
    pub cache_salt: Option<String>,
    /// Per-call timeout.
    pub timeout: Duration,
    /// The endpoint's API key, sent as a bearer token.
    pub api_key: Option<ApiKey>,
    /// Extra headers sent with every request.
    pub headers: BTreeMap<String, String>,
}

/// Headers a runtime's `headers` may not set: the client sets them itself.
const RESERVED_HEADERS: &[&str] = &["authorization", "x-session-id", "content-type", "content-length", "host"];

/// An API key: its `Debug` form never shows it, so logged requests do not leak it.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(pub String);

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(***)")
    }
}

/// Valid header names and values that do not override what the client sets.
fn checked_headers(
    headers: &std::collections::HashMap<String, String>,
    field: &str,
) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for (name, value) in headers {
        let key = format!("{field}.headers.{name}");
        if RESERVED_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
            return Err(Error::bad_request(key, "is set by the env server itself"));
        }
        if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err()
            || reqwest::header::HeaderValue::from_str(value).is_err()
        {
            return Err(Error::bad_request(key, "is not a valid HTTP header name and value"));
        }
        out.insert(name.clone(), value.clone());
    }
    Ok(out)
}

/// Default per-call timeout when the request leaves it at 0.
pub const DEFAULT_MODEL_TIMEOUT: Duration = Duration::from_secs(600);

impl ModelRuntime {
    /// Validates and decodes a wire runtime; `field` names it in errors.
    pub fn from_wire(m: &pb::ModelRuntime, field: &str) -> Result<Self> {
        if !(m.base_url.starts_with("http://") || m.base_url.starts_with("https://")) {
            return Err(Error::bad_request(
                format!("{field}.base_url"),
                format!("must be an http(s) URL, got {:?}", m.base_url),
            ));
        }
        // Requests go to `<base_url>/chat/completions`: a query, a fragment or a path that is not
        // an OpenAI `/v1` root could point them at another route of the server (an admin one).
        let path_ok = m.base_url.trim_end_matches('/').ends_with("/v1");
        if !path_ok || m.base_url.contains(['#', '?']) || m.base_url.chars().any(char::is_whitespace) {
            return Err(Error::bad_request(
                format!("{field}.base_url"),
                format!("must be an OpenAI base URL ending in /v1, without query or fragment, got {:?}", m.base_url),
            ));
        }
        if m.model.is_empty() {
            return Err(Error::bad_request(format!("{field}.model"), "must name a model"));
        }
        let s = m.sampling.clone().unwrap_or_default();
        let temperature = s
            .temperature
            .map(Temperature::new)
            .transpose()
            .map_err(|m| Error::bad_request(format!("{field}.sampling.temperature"), m))?;
        if let Some(p) = s.top_p
            && !(p > 0.0 && p <= 1.0)
        {
            return Err(Error::bad_request(format!("{field}.sampling.top_p"), format!("must be in (0, 1], got {p}")));
        }
        let extra = if s.extra_json.trim().is_empty() {
            serde_json::Map::new()
        } else {
            match serde_json::from_str::<Value>(&s.extra_json) {
                Ok(Value::Object(map)) => map,
                _ => {
                    return Err(Error::bad_request(
                        format!("{field}.sampling.extra_json"),
                        "must be a JSON object (or empty)",
                    ));
                }
            }
        };
        // Fields the client sets itself cannot be overridden (nor smuggled in when unset).
        if let Some(k) = extra.keys().find(|k| rl_configs::RESERVED_REQUEST_FIELDS.contains(&k.as_str())) {
            return Err(Error::bad_request(
                format!("{field}.sampling.extra_json.{k}"),
                "is a field the env server sets itself",
            ));
        }
        // The configs' bound on any duration (past ~1.8e19 s a `Duration` does not exist).
        let max = rl_configs::MAX_SECONDS;
        if !(0.0..=max).contains(&m.timeout_s) {
            return Err(Error::bad_request(
                format!("{field}.timeout_s"),
                format!(
                    "must be in [0, {max}] seconds (0: the default, {DEFAULT_MODEL_TIMEOUT:?}), got {}",
                    m.timeout_s
                ),
            ));
        }
        Ok(ModelRuntime {
            base_url: m.base_url.trim_end_matches('/').to_owned(),
            model: m.model.clone(),
            sampling: Sampling {
                temperature,
                top_p: s.top_p,
                top_k: s.top_k,
                max_completion_tokens: s.max_completion_tokens,
                stop: s.stop,
                seed: s.seed,
                extra,
            },
            tokens: m.tokens,
            cache_salt: Some(m.cache_salt.clone()).filter(|s| !s.is_empty()),
            timeout: if m.timeout_s > 0.0 { Duration::from_secs_f64(m.timeout_s) } else { DEFAULT_MODEL_TIMEOUT },
            api_key: Some(m.api_key.trim()).filter(|k| !k.is_empty()).map(|k| ApiKey(k.to_owned())),
            headers: checked_headers(&m.headers, field)?,
        })
    }

    /// The wire form.
    pub fn to_wire(&self) -> pb::ModelRuntime {
        pb::ModelRuntime {
            base_url: self.base_url.clone(),
            model: self.model.clone(),
            sampling: Some(pb::SamplingArgs {
                temperature: self.sampling.temperature.map(Temperature::value),
                top_p: self.sampling.top_p,
                top_k: self.sampling.top_k,
                max_completion_tokens: self.sampling.max_completion_tokens,
                stop: self.sampling.stop.clone(),
                seed: self.sampling.seed,
                extra_json: if self.sampling.extra.is_empty() {
                    String::new()
                } else {
                    Value::Object(self.sampling.extra.clone()).to_string()
                },
            }),
            tokens: self.tokens,
            cache_salt: self.cache_salt.clone().unwrap_or_default(),
            timeout_s: self.timeout.as_secs_f64(),
            api_key: self.api_key.as_ref().map(|k| k.0.clone()).unwrap_or_default(),
            headers: self.headers.clone().into_iter().collect(),
        }
    }
}

/// Converts a message to its wire node (without tokens).
pub(crate) fn message_node(m: &Message, parent: i32) -> pb::MessageNode {
    pb::MessageNode {
        parent,
        role: m.role.as_str().to_owned(),
        content: m.content.clone(),
        tool_calls: m
            .tool_calls
            .iter()
            .map(|c| pb::ToolCall { id: c.id.clone(), name: c.name.clone(), arguments: c.arguments.clone() })
            .collect(),
        tool_call_id: m.tool_call_id.clone().unwrap_or_default(),
        ..Default::default()
    }
}

/// Converts a tool to its wire form.
pub(crate) fn tool_spec(t: &ToolSpec) -> pb::ToolSpec {
    pb::ToolSpec { name: t.name.clone(), description: t.description.clone(), parameters_json: t.parameters.to_string() }
}
