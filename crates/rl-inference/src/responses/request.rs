//! A Responses API request as a chat completion request: `instructions` and the `input` items
//! (messages, `function_call`, `function_call_output`, `reasoning`) as chat messages, function
//! tools in the chat shape, `tool_choice`, `text.format` as `response_format`,
//! `max_output_tokens` as `max_tokens`; any other field passes on as the chat route reads it
//! (vLLM's sampling extensions included).

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Map, Value, json};

use super::Echo;
use crate::api::ChatRequest;
use crate::error::{Error, Result};

/// Fields a response object repeats from its request.
const ECHOED: &[&str] = &[
    "instructions",
    "tools",
    "tool_choice",
    "temperature",
    "top_p",
    "max_output_tokens",
    "parallel_tool_calls",
    "text",
    "metadata",
];

/// The chat request a Responses API request amounts to, and what its response repeats.
pub(crate) fn chat_request(body: Value) -> Result<(ChatRequest, Echo)> {
    let Value::Object(mut body) = body else {
        return Err(Error::BadRequest(String::from("a response request must be a JSON object")));
    };
    let fields: Map<String, Value> =
        ECHOED.iter().filter_map(|k| body.get(*k).map(|v| ((*k).to_owned(), v.clone()))).collect();
    for (key, why) in [
        ("previous_response_id", "this server stores no responses: send the whole conversation as `input`"),
        ("conversation", "this server stores no conversations: send the whole conversation as `input`"),
    ] {
        if body.remove(key).is_some_and(|v| !v.is_null()) {
            return Err(Error::BadRequest(format!("`{key}` is not supported: {why}")));
        }
    }
    if body.remove("background").is_some_and(|v| v == json!(true)) {
        return Err(Error::BadRequest(String::from("`background` is not supported: a response is answered at once")));
    }
    let mut messages = Vec::new();
    match body.remove("instructions") {
        Some(Value::String(text)) => messages.push(json!({"role": "system", "content": text})),
        Some(Value::Array(items)) => messages.extend(input_messages(items)?),
        Some(Value::Null) | None => {}
        Some(_) => return Err(Error::BadRequest(String::from("`instructions` must be a string"))),
    }
    match body.remove("input") {
        Some(Value::String(text)) => messages.push(json!({"role": "user", "content": text})),
        Some(Value::Array(items)) => messages.extend(input_messages(items)?),
        _ => return Err(Error::BadRequest(String::from("`input` is required: a string or a list of input items"))),
    }
    let mut chat = body;
    chat.insert(String::from("messages"), Value::Array(messages));
    if let Some(tools) = chat.remove("tools") {
        chat.insert(String::from("tools"), chat_tools(tools)?);
    }
    if let Some(choice) = chat.remove("tool_choice") {
        chat.insert(String::from("tool_choice"), chat_tool_choice(choice)?);
    }
    if let Some(max) = chat.remove("max_output_tokens").filter(|m| !m.is_null()) {
        if max.as_u64().is_none_or(|m| m == 0 || m > u64::from(u32::MAX)) {
            return Err(Error::BadRequest(format!("`max_output_tokens` must be a positive integer, got {max}")));
        }
        chat.insert(String::from("max_tokens"), max);
    }
    if let Some(text) = chat.remove("text")
        && let Some(format) = response_format(&text)?
    {
        chat.insert(String::from("response_format"), format);
    }
    if chat.get("stream") == Some(&json!(true)) {
        // The usage of the closing `response.completed` event comes from the chat stream's last chunk.
        chat.insert(String::from("stream_options"), json!({"include_usage": true}));
    }
    if chat.get("n").is_some_and(|n| *n != json!(1)) {
        return Err(Error::BadRequest(String::from("a response has one output: `n` must be 1")));
    }
    let req: ChatRequest = serde_json::from_value(Value::Object(chat))
        .map_err(|e| Error::BadRequest(format!("the response request, read as a chat completion: {e}")))?;
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let id = format!("resp_{}", NEXT.fetch_add(1, Ordering::Relaxed));
    Ok((req, Echo { id, model: String::new(), fields }))
}

/// Input items as chat messages: consecutive `function_call`s are one assistant message's calls
/// (joined to the assistant message before them), a `reasoning` item the next assistant
/// message's `reasoning_content`.
fn input_messages(items: Vec<Value>) -> Result<Vec<Value>> {
    let mut out: Vec<Value> = Vec::new();
    let mut reasoning: Option<String> = None;
    for (i, item) in items.into_iter().enumerate() {
        let at = |what: &str| Error::BadRequest(format!("input item {i}: {what}"));
        let kind = item.get("type").and_then(Value::as_str).unwrap_or("message");
        match kind {
            "message" => {
                let role = item.get("role").and_then(Value::as_str).ok_or_else(|| at("a message needs a `role`"))?;
                let content = content_text(item.get("content"), i)?;
                let mut message = json!({"role": role, "content": content});
                if role == "assistant"
                    && let Some(r) = reasoning.take()
                {
                    message["reasoning_content"] = json!(r);
                }
                out.push(message);
            }
            "function_call" => {
                let field = |f: &str| {
                    item.get(f).and_then(Value::as_str).ok_or_else(|| at(&format!("a function_call needs `{f}`")))
                };
                let call = json!({"id": field("call_id")?, "type": "function",
                                  "function": {"name": field("name")?, "arguments": field("arguments")?}});
                let open = out.last_mut().filter(|m| m["role"] == "assistant");
                match open {
                    Some(message) => match message.get_mut("tool_calls").and_then(Value::as_array_mut) {
                        Some(calls) => calls.push(call),
                        None => message["tool_calls"] = json!([call]),
                    },
                    None => {
                        let mut message = json!({"role": "assistant", "content": "", "tool_calls": [call]});
                        if let Some(r) = reasoning.take() {
                            message["reasoning_content"] = json!(r);
                        }
                        out.push(message);
                    }
                }
            }
            "function_call_output" => {
                let call_id = item
                    .get("call_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| at("a function_call_output needs `call_id`"))?;
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    other => content_text(other, i)?,
                };
                out.push(json!({"role": "tool", "tool_call_id": call_id, "content": output}));
            }
            "reasoning" => {
                let texts = |f: &str| -> Vec<String> {
                    item.get(f)
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .filter_map(|p| p.get("text").and_then(Value::as_str).map(str::to_owned))
                        .collect()
                };
                let content = texts("content");
                let text = if content.is_empty() { texts("summary") } else { content }.join("\n");
                if !text.is_empty() {
                    reasoning = Some(text);
                }
            }
            other => {
                return Err(at(&format!(
                    "`{other}` items are not supported (message, function_call, function_call_output and reasoning are)"
                )));
            }
        }
    }
    Ok(out)
}

/// A message's content as text: a string, or its text parts (`input_text`, `output_text`,
/// `text`, `refusal`) joined.
fn content_text(content: Option<&Value>, i: usize) -> Result<String> {
    match content {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(|p| match p.get("type").and_then(Value::as_str) {
                Some("input_text" | "output_text" | "text") => {
                    Ok(p.get("text").and_then(Value::as_str).unwrap_or_default().to_owned())
                }
                Some("refusal") => Ok(p.get("refusal").and_then(Value::as_str).unwrap_or_default().to_owned()),
                other => Err(Error::BadRequest(format!(
                    "input item {i}: content parts of type {} are not supported: this server reads text",
                    other.unwrap_or("(none)")
                ))),
            })
            .collect::<Result<Vec<_>>>()
            .map(|texts| texts.concat()),
        Some(Value::Null) | None => Ok(String::new()),
        Some(_) => Err(Error::BadRequest(format!("input item {i}: `content` must be a string or a list of parts"))),
    }
}

/// Function tools (`{type, name, description, parameters, strict}`) in the chat shape.
fn chat_tools(tools: Value) -> Result<Value> {
    let Value::Array(tools) = tools else { return Err(Error::BadRequest(String::from("`tools` must be a list"))) };
    tools
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            if t.get("type").and_then(Value::as_str) != Some("function") {
                return Err(Error::BadRequest(format!(
                    "tools[{i}]: only function tools are supported (hosted tools such as web search run at OpenAI)"
                )));
            }
            let mut function = Map::new();
            for field in ["name", "description", "parameters", "strict"] {
                if let Some(v) = t.get(field).filter(|v| !v.is_null()) {
                    function.insert(field.to_owned(), v.clone());
                }
            }
            Ok(json!({"type": "function", "function": function}))
        })
        .collect::<Result<Vec<_>>>()
        .map(Value::Array)
}

/// `auto` / `none` / `required`, or `{type: "function", name}` as the chat route's named choice.
fn chat_tool_choice(choice: Value) -> Result<Value> {
    match &choice {
        Value::String(_) => Ok(choice),
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
            let name =
                o.get("name").cloned().ok_or_else(|| Error::BadRequest(String::from("tool_choice needs a `name`")))?;
            Ok(json!({"type": "function", "function": {"name": name}}))
        }
        _ => Err(Error::BadRequest(format!(
            "tool_choice {choice} is not supported (auto, none, required or a function)"
        ))),
    }
}

/// `text.format`: `json_schema` and `json_object` as the chat route's `response_format`; `text`
/// is no constraint.
fn response_format(text: &Value) -> Result<Option<Value>> {
    let Some(format) = text.get("format").filter(|f| !f.is_null()) else { return Ok(None) };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let mut schema = Map::new();
            for field in ["name", "schema", "strict", "description"] {
                if let Some(v) = format.get(field).filter(|v| !v.is_null()) {
                    schema.insert(field.to_owned(), v.clone());
                }
            }
            Ok(Some(json!({"type": "json_schema", "json_schema": schema})))
        }
        _ => Err(Error::BadRequest(format!("text.format {format} is not supported (text, json_object, json_schema)"))),
    }
}
