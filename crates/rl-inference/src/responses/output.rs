//! A chat completion as a response object: a thinking model's reasoning as a `reasoning` output
//! item, the reply's text as a `message` item, its tool calls as `function_call` items, the usage
//! in the Responses API's names, and a reply cut at the token limit `incomplete`.

use serde_json::{Map, Value, json};

use super::Echo;
use crate::state::now;

/// The response object for a whole chat completion (its one choice).
pub(crate) fn response_object(chat: &Value, echo: &Echo) -> Value {
    let choice = &chat["choices"][0];
    let message = &choice["message"];
    let mut output = Vec::new();
    if let Some(thought) = message["reasoning_content"].as_str() {
        output.push(reasoning_item(&echo.id, thought, "completed"));
    }
    let text = message["content"].as_str().unwrap_or_default();
    let calls = message["tool_calls"].as_array().cloned().unwrap_or_default();
    if !text.is_empty() || calls.is_empty() {
        output.push(message_item(&echo.id, text, "completed"));
    }
    for call in &calls {
        output.push(function_call_item(call, "completed"));
    }
    let mut body = base(echo, status(choice["finish_reason"].as_str()));
    body["output"] = Value::Array(output);
    body["usage"] = usage(&chat["usage"]);
    body
}

/// The response object's fields that are not its output: id, status, model and what the request
/// set (`in_progress` for the stream's first events).
pub(super) fn base(echo: &Echo, status: &str) -> Value {
    let mut body = json!({
        "id": echo.id,
        "object": "response",
        "created_at": now(),
        "status": status,
        "model": echo.model,
        "output": [],
        "error": null,
        "incomplete_details": if status == "incomplete" { json!({"reason": "max_output_tokens"}) } else { Value::Null },
        "instructions": null,
        "metadata": {},
        "parallel_tool_calls": true,
        "temperature": null,
        "top_p": null,
        "tool_choice": "auto",
        "tools": [],
        "text": {"format": {"type": "text"}},
        "max_output_tokens": null,
        "usage": null,
    });
    if let Value::Object(fields) = &mut body {
        for (k, v) in &echo.fields {
            fields.insert(k.clone(), v.clone());
        }
    }
    body
}

/// `incomplete` for a reply cut at the token limit, else `completed`.
pub(super) fn status(finish_reason: Option<&str>) -> &'static str {
    if finish_reason == Some("length") { "incomplete" } else { "completed" }
}

/// An assistant `message` output item holding `text`.
pub(super) fn message_item(response_id: &str, text: &str, status: &str) -> Value {
    json!({
        "type": "message",
        "id": format!("msg_{}", response_id.trim_start_matches("resp_")),
        "status": status,
        "role": "assistant",
        "content": if status == "in_progress" { json!([]) } else { json!([text_part(text)]) },
    })
}

/// A `reasoning` output item holding the reply's reasoning text.
pub(super) fn reasoning_item(response_id: &str, text: &str, status: &str) -> Value {
    json!({
        "type": "reasoning",
        "id": format!("rs_{}", response_id.trim_start_matches("resp_")),
        "status": status,
        "summary": [],
        "content": if status == "in_progress" { json!([]) } else { json!([{"type": "reasoning_text", "text": text}]) },
    })
}

/// An `output_text` content part.
pub(super) fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// A chat tool call (`{id, function: {name, arguments}}`) as a `function_call` output item.
pub(super) fn function_call_item(call: &Value, status: &str) -> Value {
    let id = call["id"].as_str().unwrap_or_default();
    json!({
        "type": "function_call",
        "id": format!("fc_{id}"),
        "call_id": id,
        "name": call["function"]["name"],
        "arguments": call["function"]["arguments"].as_str().unwrap_or_default(),
        "status": status,
    })
}

/// The chat usage in the Responses API's names.
pub(super) fn usage(chat: &Value) -> Value {
    let n = |k: &str| chat[k].as_u64().unwrap_or(0);
    let mut usage = Map::new();
    usage.insert(String::from("input_tokens"), json!(n("prompt_tokens")));
    usage.insert(
        String::from("input_tokens_details"),
        json!({"cached_tokens": chat["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0)}),
    );
    usage.insert(String::from("output_tokens"), json!(n("completion_tokens")));
    usage.insert(String::from("output_tokens_details"), json!({"reasoning_tokens": 0}));
    usage.insert(String::from("total_tokens"), json!(n("total_tokens")));
    Value::Object(usage)
}
