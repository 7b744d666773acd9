//! Hostile requests: each route's valid body with fields replaced by arbitrary JSON (numbers at
//! and past every bound, wrong types, nested junk, strings the parsers look for) is answered with
//! a 2xx or a 4xx carrying the OpenAI error object: never a 5xx, a dropped connection or a stuck
//! engine (a plain request is answered after every case).

use std::time::Duration;

use proptest::prelude::*;
use serde_json::{Map, Value, json};

/// Field names the routes read, and a few they do not.
const FIELDS: &[&str] = &[
    "model",
    "n",
    "temperature",
    "top_p",
    "top_k",
    "max_completion_tokens",
    "max_tokens",
    "stop",
    "seed",
    "logprobs",
    "top_logprobs",
    "return_token_ids",
    "prompt_logprobs",
    "echo",
    "stream",
    "stream_options",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_p",
    "logit_bias",
    "ignore_eos",
    "allowed_token_ids",
    "include_stop_str_in_output",
    "min_tokens",
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "skip_special_tokens",
    "stop_token_ids",
    "messages",
    "tools",
    "tool_choice",
    "add_generation_prompt",
    "continue_final_message",
    "parallel_tool_calls",
    "chat_template_kwargs",
    "prompt",
    "input",
    "instructions",
    "max_output_tokens",
    "text",
    "reasoning",
    "metadata",
    "token_ids",
    "sampling_params",
    "request_id",
    "priority",
    "tokens",
    "user",
    "unheard_of",
];

/// Keys of nested objects: the ones the parsers look inside for.
const KEYS: &[&str] = &[
    "type",
    "name",
    "function",
    "json_schema",
    "schema",
    "role",
    "content",
    "text",
    "arguments",
    "parameters",
    "properties",
    "required",
    "items",
    "enum",
    "format",
    "json",
    "regex",
    "choice",
    "grammar",
    "json_object",
    "include_usage",
    "tool_calls",
    "reasoning_content",
    "effort",
    "additionalProperties",
    "$ref",
    "anyOf",
    "pattern",
    "minLength",
    "maxItems",
    "0",
    "100000",
];

/// Strings the parsers and templates give meaning to.
const WORDS: &[&str] = &[
    "",
    "auto",
    "none",
    "required",
    "text",
    "json_object",
    "json_schema",
    "user",
    "assistant",
    "system",
    "developer",
    "tool",
    "function",
    "object",
    "string",
    "integer",
    "array",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<|im_end|>",
    "<|python_tag|>",
    "{\"name\": 1}",
    "start: \"a\"+",
    "start: start",
    "(a|aa)*b",
    "[\u{a1}\u{a2}]",
    "ok|\u{a1}",
    "[^a-z]{2,}",
    "\\d{3}",
    "[",
    "\\",
    "🙂漢é",
    "\u{0}",
    "tiny",
    "input_text",
    "message",
    "function_call_output",
];

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        prop::sample::select(vec![-1i64, 0, 1, 2, 5, 63, 64, 65, 511, 512, 100_000, 1 << 31, 1 << 32, i64::MAX])
            .prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        prop::sample::select(vec![-1e300, -2.0, -0.0, 1e-30, 0.01, 0.5, 1.0, 1.5, 2.0, 3.0, 1e300])
            .prop_map(Value::from),
        prop::sample::select(WORDS.to_vec()).prop_map(Value::from),
        ".{0,24}".prop_map(Value::from),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(KEYS.to_vec()), inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())),
        ]
    })
}

/// A route and a valid body for it.
fn route() -> impl Strategy<Value = (&'static str, Value)> {
    let user = json!([{"role": "user", "content": "hi"}]);
    prop::sample::select(vec![
        ("/v1/chat/completions", json!({"messages": user, "max_completion_tokens": 4})),
        (
            "/v1/chat/completions",
            json!({"messages": user, "max_completion_tokens": 8, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}}, "required": ["a"]}}}], "tool_choice": "required"}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}, {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}, {"role": "tool", "tool_call_id": "c", "content": "ok"}], "max_completion_tokens": 4, "logprobs": true, "top_logprobs": 2}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": user, "max_completion_tokens": 6, "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object", "properties": {"n": {"type": "integer"}}}}}}),
        ),
        ("/v1/completions", json!({"prompt": "hi", "max_tokens": 4})),
        (
            "/v1/completions",
            json!({"prompt": ["a", "b"], "max_tokens": 3, "n": 2, "echo": true, "logprobs": 1, "stop": ["x"], "structured_outputs": {"regex": "[ab]+"}}),
        ),
        ("/v1/responses", json!({"input": "hi", "max_output_tokens": 4})),
        (
            "/v1/responses",
            json!({"instructions": "i", "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}, {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}, {"type": "function_call_output", "call_id": "c", "output": "ok"}], "max_output_tokens": 4, "text": {"format": {"type": "json_object"}}}),
        ),
        ("/inference/v1/generate", json!({"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 4}})),
        ("/tokenize", json!({"messages": user})),
        ("/detokenize", json!({"tokens": [1, 2, 3]})),
    ])
}

/// An edit of a body: set a field (at the top or inside `sampling_params`, `messages[0]` or
/// `tools[0]`), remove one, or replace whatever lies at a path (each step picks a child by index,
/// modulo how many there are).
#[derive(Debug, Clone)]
enum Edit {
    Set(&'static str, Value),
    SetInside(&'static str, &'static str, Value),
    Remove(&'static str),
    Deep(Vec<usize>, Value),
}

fn edit() -> impl Strategy<Value = Edit> {
    let field = || prop::sample::select(FIELDS.to_vec());
    prop_oneof![
        4 => (field(), value()).prop_map(|(f, v)| Edit::Set(f, v)),
        2 => (prop::sample::select(vec!["sampling_params", "messages", "tools", "response_format"]), prop::sample::select(KEYS.iter().chain(FIELDS).copied().collect::<Vec<_>>()), value())
            .prop_map(|(at, f, v)| Edit::SetInside(at, f, v)),
        1 => field().prop_map(Edit::Remove),
        4 => (prop::collection::vec(any::<usize>(), 1..6), value()).prop_map(|(path, v)| Edit::Deep(path, v)),
    ]
}

fn apply(body: &mut Value, edit: &Edit) {
    if let Edit::Deep(path, v) = edit {
        replace_at(body, path, v);
        return;
    }
    let Some(top) = body.as_object_mut() else { return };
    match edit {
        Edit::Set(f, v) => {
            top.insert((*f).to_owned(), v.clone());
        }
        Edit::Remove(f) => {
            top.remove(*f);
        }
        Edit::Deep(..) => {}
        Edit::SetInside(at, f, v) => {
            let slot = top.entry((*at).to_owned()).or_insert_with(|| match *at {
                "messages" | "tools" => json!([{}]),
                _ => json!({}),
            });
            let target = match slot {
                Value::Array(items) if !items.is_empty() => &mut items[0],
                other => other,
            };
            if let Value::Object(map) = target {
                map.insert((*f).to_owned(), v.clone());
            } else {
                *target = Value::Object(Map::from_iter([((*f).to_owned(), v.clone())]));
            }
        }
    }
}

/// Replaces what lies at `path` (or, where the path runs out of children, the last node on it).
fn replace_at(at: &mut Value, path: &[usize], v: &Value) {
    let Some((&step, rest)) = path.split_first() else {
        *at = v.clone();
        return;
    };
    let child = match at {
        Value::Object(map) if !map.is_empty() => {
            let n = map.len();
            map.values_mut().nth(step % n)
        }
        Value::Array(items) if !items.is_empty() => {
            let n = items.len();
            items.get_mut(step % n)
        }
        _ => None,
    };
    match child {
        Some(child) => replace_at(child, rest, v),
        None => *at = v.clone(),
    }
}

/// Posts `body`; the status and the body's text, or why no answer came.
async fn post(srv: &crate::Srv, path: &str, body: &Value) -> Result<(u16, String), String> {
    let sent = srv.http.post(format!("{}{path}", srv.base)).json(body).timeout(Duration::from_secs(60)).send();
    let r = sent.await.map_err(|e| format!("no answer: {e}"))?;
    let status = r.status().as_u16();
    let text = r.text().await.map_err(|e| format!("the body broke off: {e}"))?;
    Ok((status, text))
}

#[test]
fn hostile_bodies_get_client_errors_and_the_server_keeps_serving() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    // A short context bounds every accepted request's work.
    let srv = rt.block_on(crate::start(|c| c.max_model_len = Some(64)));
    let plain = json!({"prompt": "hi", "max_tokens": 1});
    // 512 in CI; `PROPTEST_CASES` (proptest's own variable) asks for a longer search.
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(512);
    let config = ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() };
    proptest!(config, |((path, body) in route(), edits in prop::collection::vec(edit(), 1..4))| {
        let mut body = body;
        for e in &edits {
            apply(&mut body, e);
        }
        let (status, text) = rt.block_on(post(&srv, path, &body)).map_err(TestCaseError::fail)?;
        prop_assert!(status < 500, "{path} {body}: {status} {text}");
        if status >= 400 {
            let v: Value = serde_json::from_str(&text).map_err(|e| TestCaseError::fail(format!("{path} {body}: {status} with a body that is not JSON ({e}): {text}")))?;
            prop_assert!(v["error"]["message"].is_string(), "{path} {body}: {status} without the error object: {text}");
        }
        let (status, text) = rt.block_on(post(&srv, "/v1/completions", &plain)).map_err(TestCaseError::fail)?;
        prop_assert_eq!(status, 200, "after {} {}: a plain request got {}", path, body, text);
    });
}
