//! OpenAI request bodies (with the vLLM extensions) and their validation into engine requests.

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde_json::Value;

use rl_configs::Temperature;
use rl_model::Penalties;

use crate::error::{Error, Result};
use crate::generation::GenRequest;
use crate::prompt::Prompt;
use crate::structured::{ConstraintFields, Grammars};

/// A message of a chat request.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ChatMessage {
    pub(crate) role: String,
    #[serde(default)]
    pub(crate) content: Option<Value>,
    #[serde(default)]
    pub(crate) tool_calls: Option<Vec<Value>>,
    /// An assistant's reasoning apart from its content (vLLM: `reasoning_content`, or `reasoning`).
    #[serde(default, alias = "reasoning")]
    pub(crate) reasoning_content: Option<String>,
}

/// `stop` may be a string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum Stop {
    One(String),
    Many(Vec<String>),
}

/// Sampling fields shared by chat and text completions (and `sampling_params` of
/// `/inference/v1/generate`). Unknown fields are accepted and ignored, as OpenAI-compatible servers
/// do; that includes vLLM's `cache_salt`: the prompt cache is emptied on every weight swap, so the
/// policy version a training client salts with is already part of what a cached prompt means.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Sampling {
    #[serde(default)]
    pub(crate) model: Option<String>,
    #[serde(default = "one")]
    pub(crate) n: u32,
    #[serde(default)]
    pub(crate) temperature: Option<f64>,
    #[serde(default)]
    pub(crate) top_p: Option<f32>,
    #[serde(default)]
    pub(crate) top_k: Option<i64>,
    #[serde(default)]
    pub(crate) max_completion_tokens: Option<u32>,
    #[serde(default)]
    pub(crate) max_tokens: Option<u32>,
    #[serde(default)]
    pub(crate) stop: Option<Stop>,
    #[serde(default)]
    pub(crate) seed: Option<u64>,
    #[serde(default)]
    pub(crate) logprobs: Option<Value>,
    #[serde(default)]
    pub(crate) top_logprobs: Option<u32>,
    /// vLLM: return `prompt_token_ids` and `choices[].token_ids`.
    #[serde(default)]
    pub(crate) return_token_ids: bool,
    /// vLLM: log-probabilities of the prompt tokens, with this many alternatives.
    #[serde(default)]
    pub(crate) prompt_logprobs: Option<u32>,
    /// OpenAI (text completions): the prompt comes back before each completion, with its tokens'
    /// logprobs when `logprobs` is asked for (how lm-evaluation-harness scores continuations).
    #[serde(default)]
    pub(crate) echo: bool,
    #[serde(default)]
    pub(crate) stream: bool,
    /// OpenAI: `{"include_usage": true}` adds a last chunk with the usage.
    #[serde(default)]
    pub(crate) stream_options: Option<Value>,
    /// OpenAI: subtracted once from the logit of every token already in the output.
    #[serde(default)]
    pub(crate) presence_penalty: Option<f32>,
    /// OpenAI: subtracted from a token's logit per time it is already in the output.
    #[serde(default)]
    pub(crate) frequency_penalty: Option<f32>,
    /// vLLM/HF: logits of tokens in the prompt or output divided (positive) or multiplied by it.
    #[serde(default)]
    pub(crate) repetition_penalty: Option<f32>,
    /// vLLM: tokens less likely than this times the most likely one are not sampled.
    #[serde(default)]
    pub(crate) min_p: Option<f32>,
    /// OpenAI: token id (as a string) -> bias added to its logit, in [-100, 100].
    #[serde(default)]
    pub(crate) logit_bias: Option<std::collections::BTreeMap<String, f64>>,
    /// vLLM: end-of-sequence tokens do not end a completion.
    #[serde(default)]
    pub(crate) ignore_eos: bool,
    /// vLLM: only these token ids can be sampled.
    #[serde(default)]
    pub(crate) allowed_token_ids: Option<Vec<u32>>,
    /// vLLM: the stop string that ended a completion stays in its text.
    #[serde(default)]
    pub(crate) include_stop_str_in_output: bool,
    /// vLLM: no end-of-sequence token or stop string before this many tokens.
    #[serde(default)]
    pub(crate) min_tokens: Option<u32>,
    /// Structured-output constraints (`response_format`, `structured_outputs`, `guided_*`),
    /// taken out of the fields before the rest are read.
    #[serde(skip)]
    pub(crate) constraint: ConstraintFields,
    /// vLLM: special tokens left out of the text (vLLM's default is true; this server keeps
    /// them, which is what training clients ask for, so only false is accepted).
    #[serde(default)]
    pub(crate) skip_special_tokens: Option<bool>,
    /// The fields this server read past (logged once per name).
    #[serde(skip)]
    pub(crate) ignored: Vec<String>,
    /// vLLM: token ids that end a completion as the end-of-sequence token does (the token stays in
    /// `token_ids`, not in the text; masked like it before `min_tokens`).
    #[serde(default)]
    pub(crate) stop_token_ids: Option<Vec<u32>>,
}

/// Most `stop_token_ids` a request may name (each sampled token is checked against them).
const MAX_STOP_TOKEN_IDS: usize = 256;

fn one() -> u32 {
    1
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone)]
pub(crate) struct ChatRequest {
    pub(crate) messages: Vec<ChatMessage>,
    pub(crate) tools: Option<Vec<Value>>,
    /// Unset: true, unless `continue_final_message` is set.
    pub(crate) add_generation_prompt: Option<bool>,
    /// vLLM / transformers: the final message is left open and the reply continues it (prefill).
    pub(crate) continue_final_message: bool,
    /// OpenAI: false allows at most one tool call per reply.
    pub(crate) parallel_tool_calls: bool,
    /// `auto` (default), `none` (the reply is not parsed for tool calls), `required` or a named
    /// function (the reply is constrained to calls).
    pub(crate) tool_choice: Option<Value>,
    /// Extra chat-template variables (`enable_thinking`, ...).
    pub(crate) chat_template_kwargs: serde_json::Map<String, Value>,
    pub(crate) sampling: Sampling,
}

// Requests are read field by field, never through `#[serde(flatten)]` or untagged enums: those
// buffer the whole body in serde's generic `Content` first (a prompt of 4M token ids took 160 MB
// that way). Only the small leftover fields are collected to become `Sampling`.
impl<'de> Deserialize<'de> for ChatRequest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Fields;
        impl<'de> Visitor<'de> for Fields {
            type Value = ChatRequest;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a chat completion request object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<ChatRequest, A::Error> {
                let (mut messages, mut tools, mut add_generation_prompt) = (None, None, None);
                let (mut continue_final_message, mut parallel_tool_calls) = (false, true);
                let (mut tool_choice, mut chat_template_kwargs) = (None, serde_json::Map::new());
                let mut rest = serde_json::Map::new();
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "messages" => messages = Some(map.next_value()?),
                        "tools" => tools = map.next_value()?,
                        "add_generation_prompt" => add_generation_prompt = map.next_value()?,
                        "continue_final_message" => {
                            continue_final_message = map.next_value::<Option<bool>>()?.unwrap_or(false);
                        }
                        "parallel_tool_calls" => {
                            parallel_tool_calls = map.next_value::<Option<bool>>()?.unwrap_or(true);
                        }
                        "tool_choice" => tool_choice = map.next_value()?,
                        "chat_template_kwargs" => {
                            chat_template_kwargs = map.next_value::<Option<_>>()?.unwrap_or_default();
                        }
                        _ => {
                            rest.insert(key, map.next_value()?);
                        }
                    }
                }
                Ok(ChatRequest {
                    messages: messages.ok_or_else(|| de::Error::missing_field("messages"))?,
                    tools,
                    add_generation_prompt,
                    continue_final_message,
                    parallel_tool_calls,
                    tool_choice,
                    chat_template_kwargs,
                    sampling: Sampling::from_fields(Value::Object(rest)).map_err(de::Error::custom)?,
                })
            }
        }
        d.deserialize_map(Fields)
    }
}

/// `POST /tokenize` (vLLM): chat messages through the template, or a text prompt, to token ids.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct TokenizeRequest {
    #[serde(default)]
    pub(crate) model: Option<String>,
    #[serde(default)]
    pub(crate) messages: Option<Vec<ChatMessage>>,
    #[serde(default)]
    pub(crate) prompt: Option<String>,
    #[serde(default)]
    pub(crate) tools: Option<Vec<Value>>,
    /// As in a chat request, so `/tokenize` gives the tokens the chat route would prompt with.
    #[serde(default)]
    pub(crate) add_generation_prompt: Option<bool>,
    #[serde(default)]
    pub(crate) continue_final_message: bool,
    #[serde(default)]
    pub(crate) chat_template_kwargs: Option<serde_json::Map<String, Value>>,
}

impl Limits {
    /// Checks a request's `model` against the served name.
    pub(crate) fn check_model(&self, model: Option<&String>) -> Result<()> {
        match model {
            Some(m) if m != &self.model_name => Err(Error::UnknownModel(format!(
                "The model `{m}` does not exist; this server serves `{}`.",
                self.model_name
            ))),
            _ => Ok(()),
        }
    }
}

/// `POST /v1/completions`.
#[derive(Debug, Clone)]
pub(crate) struct CompletionRequest {
    pub(crate) prompt: Prompt,
    pub(crate) sampling: Sampling,
}

impl<'de> Deserialize<'de> for CompletionRequest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Fields;
        impl<'de> Visitor<'de> for Fields {
            type Value = CompletionRequest;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a completion request object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<CompletionRequest, A::Error> {
                let mut prompt = None;
                let mut rest = serde_json::Map::new();
                while let Some(key) = map.next_key::<String>()? {
                    if key == "prompt" {
                        prompt = Some(map.next_value()?);
                    } else {
                        rest.insert(key, map.next_value()?);
                    }
                }
                Ok(CompletionRequest {
                    prompt: prompt.ok_or_else(|| de::Error::missing_field("prompt"))?,
                    sampling: Sampling::from_fields(Value::Object(rest)).map_err(de::Error::custom)?,
                })
            }
        }
        d.deserialize_map(Fields)
    }
}

/// Limits a request is checked against.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    pub(crate) model_name: String,
    pub(crate) max_model_len: usize,
    pub(crate) max_n: u32,
    pub(crate) default_seed: u64,
    pub(crate) vocab_size: usize,
    /// Compiles structured-output constraints for this model's tokenizer.
    pub(crate) grammars: std::sync::Arc<Grammars>,
    /// Sampling fields for requests that leave them out (the model's generation config).
    pub(crate) defaults: crate::sampling_defaults::SamplingDefaults,
}

impl Sampling {
    /// The sampling fields of a request; a wrong-typed field is named (`max_tokens: invalid type:
    /// string "5", expected u32`).
    pub(crate) fn from_fields(fields: Value) -> std::result::Result<Sampling, String> {
        let Value::Object(mut map) = fields else { return Err(String::from("the sampling fields must be an object")) };
        let constraint = ConstraintFields::take(&mut map)?;
        let mut ignored = Vec::new();
        let mut note = |path: serde_ignored::Path<'_>| ignored.push(path.to_string());
        let fields = serde_ignored::Deserializer::new(Value::Object(map), &mut note);
        let mut sampling: Sampling = serde_path_to_error::deserialize(fields).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            if path == "." { inner.to_string() } else { format!("`{path}`: {inner}") }
        })?;
        sampling.constraint = constraint;
        crate::ignored_fields::warn_once(&ignored);
        sampling.ignored = ignored;
        Ok(sampling)
    }

    /// Whether per-token logprobs were asked for (`logprobs: true` for chat, a number for text).
    pub(crate) fn wants_logprobs(&self) -> bool {
        match &self.logprobs {
            Some(Value::Bool(b)) => *b,
            Some(Value::Number(_)) => true,
            _ => false,
        }
    }

    /// Validates against `limits` and builds the engine request for `prompt`.
    pub(crate) fn to_request(&self, prompt: Vec<u32>, limits: &Limits, request_seed: u64) -> Result<GenRequest> {
        limits.check_model(self.model.as_ref())?;
        if self.n == 0 || self.n > limits.max_n {
            return Err(Error::BadRequest(format!(
                "n must be in 1..={}, got {} (the server decodes at most inference.max_batch_size sequences together)",
                limits.max_n, self.n
            )));
        }
        let d = &limits.defaults;
        let temperature = Temperature::new(self.temperature.or(d.temperature).unwrap_or(1.0))
            .map_err(|m| Error::BadRequest(format!("temperature {m}")))?;
        let top_p = self.top_p.or(d.top_p).unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(Error::BadRequest(format!("top_p must be in (0, 1], got {top_p}")));
        }
        let top_k = match self.top_k.or(d.top_k) {
            None | Some(-1) => None,
            Some(k) if k >= 1 => Some(k as usize),
            Some(k) => return Err(Error::BadRequest(format!("top_k must be -1 or >= 1, got {k}"))),
        };
        if prompt.is_empty() {
            return Err(Error::BadRequest(String::from("the prompt is empty")));
        }
        if prompt.len() >= limits.max_model_len {
            return Err(Error::BadRequest(format!(
                "This model's maximum context length is {} tokens. However, you requested {} tokens in the prompt.",
                limits.max_model_len,
                prompt.len()
            )));
        }
        let room = (limits.max_model_len - prompt.len()) as u32;
        // A default from the generation config caps what the context leaves, as vLLM's does.
        let max_tokens = self
            .max_completion_tokens
            .or(self.max_tokens)
            .unwrap_or_else(|| d.max_tokens.map_or(room, |m| m.min(room)));
        if max_tokens > room {
            return Err(Error::BadRequest(format!(
                "This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the prompt, {max_tokens} for the completion).",
                limits.max_model_len,
                prompt.len() + max_tokens as usize,
                prompt.len()
            )));
        }
        let top_logprobs = self.top_logprobs.unwrap_or(match &self.logprobs {
            Some(Value::Number(n)) => n.as_u64().unwrap_or(0) as u32,
            _ => 0,
        });
        if top_logprobs > 20 {
            return Err(Error::BadRequest(format!("top_logprobs must be at most 20, got {top_logprobs}")));
        }
        if self.prompt_logprobs.is_some_and(|k| k > 20) {
            return Err(Error::BadRequest(String::from("prompt_logprobs must be at most 20")));
        }
        let (penalties, min_p) = self.penalties(limits)?;
        let min_tokens = self.min_tokens.unwrap_or(0);
        if min_tokens > max_tokens {
            return Err(Error::BadRequest(format!(
                "min_tokens ({min_tokens}) must be less than or equal to max_tokens ({max_tokens})"
            )));
        }
        if self.skip_special_tokens == Some(true) {
            return Err(Error::BadRequest(String::from(
                "skip_special_tokens = true is not supported: this server keeps special tokens in the text (send false or leave it out)",
            )));
        }
        let guide = match self.constraint.constraint()? {
            Some((constraint, style)) => Some(limits.grammars.compile(&constraint, style)?),
            None => None,
        };
        let stop = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stop.iter().any(String::is_empty) {
            return Err(Error::BadRequest(String::from("stop strings must not be empty")));
        }
        let stop_token_ids = self.stop_token_ids.clone().unwrap_or_default();
        if stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
            return Err(Error::BadRequest(format!(
                "stop_token_ids holds {} ids; at most {MAX_STOP_TOKEN_IDS} are allowed",
                stop_token_ids.len()
            )));
        }
        if let Some(bad) = stop_token_ids.iter().find(|&&t| t as usize >= limits.vocab_size) {
            return Err(Error::BadRequest(format!(
                "stop_token_ids: {bad} is outside the vocabulary of {}",
                limits.vocab_size
            )));
        }
        Ok(GenRequest {
            prompt,
            n: self.n,
            max_tokens,
            temperature,
            top_p,
            top_k,
            seed: self.seed.unwrap_or(limits.default_seed ^ request_seed),
            stop,
            stop_token_ids,
            top_logprobs,
            // An echoed prompt carries its tokens' logprobs, with the completion's alternatives.
            prompt_logprobs: self.prompt_logprobs.or((self.echo && self.wants_logprobs()).then_some(top_logprobs)),
            penalties,
            min_p,
            ignore_eos: self.ignore_eos,
            allowed_token_ids: self.allowed_token_ids(limits)?,
            include_stop_str: self.include_stop_str_in_output,
            min_tokens,
            guide,
            stream: None,
        })
    }

    /// `allowed_token_ids`, sorted and checked against the vocabulary.
    fn allowed_token_ids(&self, limits: &Limits) -> Result<Option<Vec<u32>>> {
        let Some(ids) = &self.allowed_token_ids else { return Ok(None) };
        if ids.is_empty() {
            return Err(Error::BadRequest(String::from("allowed_token_ids must name at least one token")));
        }
        if let Some(bad) = ids.iter().find(|&&t| t as usize >= limits.vocab_size) {
            return Err(Error::BadRequest(format!(
                "allowed_token_ids: {bad} is outside the vocabulary of {}",
                limits.vocab_size
            )));
        }
        let mut ids = ids.clone();
        ids.sort_unstable();
        ids.dedup();
        Ok(Some(ids))
    }

    /// The logit adjustments and `min_p`, checked against vLLM's ranges.
    fn penalties(&self, limits: &Limits) -> Result<(Penalties, f32)> {
        let bad = |m: String| Err(Error::BadRequest(m));
        for (name, v) in [("presence_penalty", self.presence_penalty), ("frequency_penalty", self.frequency_penalty)] {
            if let Some(v) = v.filter(|v| !(-2.0..=2.0).contains(v)) {
                return bad(format!("{name} must be in [-2, 2], got {v}"));
            }
        }
        if let Some(r) = self.repetition_penalty.filter(|r| !(r.is_finite() && *r > 0.0 && *r <= 10.0)) {
            return bad(format!("repetition_penalty must be in (0, 10], got {r}"));
        }
        if let Some(m) = self.min_p.filter(|m| !(0.0..=1.0).contains(m)) {
            return bad(format!("min_p must be in [0, 1], got {m}"));
        }
        let mut logit_bias = Vec::new();
        for (token, bias) in self.logit_bias.iter().flatten() {
            let id: u32 = match token.parse() {
                Ok(id) if (id as usize) < limits.vocab_size => id,
                _ => return bad(format!("logit_bias: {token:?} is not a token id of this model")),
            };
            if !(-100.0..=100.0).contains(bias) {
                return bad(format!("logit_bias: the bias of token {id} must be in [-100, 100], got {bias}"));
            }
            logit_bias.push((id, *bias as f32));
        }
        let penalties = Penalties {
            presence: self.presence_penalty.unwrap_or(0.0),
            frequency: self.frequency_penalty.unwrap_or(0.0),
            repetition: self.repetition_penalty.or(limits.defaults.repetition_penalty).unwrap_or(1.0),
            logit_bias,
        };
        Ok((penalties, self.min_p.or(limits.defaults.min_p).unwrap_or(0.0)))
    }
}

/// The text of a message's `content` (a string, or a list of `{type: text, text}` parts).
pub(crate) fn content_text(content: Option<&Value>) -> Result<String> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut out = String::new();
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    _ => return Err(Error::BadRequest(String::from("only text content parts are supported"))),
                }
            }
            Ok(out)
        }
        Some(other) => Err(Error::BadRequest(format!("message content must be text, got {other}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_read_past_are_named_and_constraints_and_known_ones_are_not() {
        let fields = serde_json::json!({"max_tokens": 3, "best_of": 2, "cache_salt": "s", "guided_regex": "a+",
            "bad_words": ["x"], "stream_options": {"include_usage": true}});
        let sampling = Sampling::from_fields(fields).unwrap();
        assert_eq!(sampling.ignored, ["best_of", "cache_salt", "bad_words"]);
        assert_eq!(sampling.max_tokens, Some(3));
        assert!(sampling.constraint.guided_regex.is_some());
        let e = Sampling::from_fields(serde_json::json!({"max_tokens": "3"})).unwrap_err();
        assert!(e.contains("`max_tokens`"), "{e}");
    }
}
