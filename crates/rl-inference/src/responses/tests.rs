//! The Responses API's requests read as chat requests, chat replies written as response objects,
//! and chat chunks as the stream's events.

use serde_json::{Value, json};

use super::events::Translator;
use super::{Echo, chat_request, response_object};

fn chat_json(body: Value) -> Value {
    // The chat request as the chat route reads it, back to JSON for comparing.
    let (req, _) = chat_request(body).unwrap();
    json!({
        "messages": req.messages.iter().map(|m| json!({
            "role": m.role, "content": m.content, "tool_calls": m.tool_calls, "reasoning_content": m.reasoning_content,
        })).collect::<Vec<_>>(),
        "tools": req.tools, "tool_choice": req.tool_choice, "parallel_tool_calls": req.parallel_tool_calls,
    })
}

#[test]
fn instructions_and_input_items_become_the_chat_messages() {
    let chat = chat_json(json!({
        "model": "m",
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Weather in "}, {"type": "input_text", "text": "Paris?"}]},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "I should look it up."}]},
            {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call", "call_id": "c2", "name": "time", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "message", "role": "developer", "content": "Answer now."},
        ],
        "tools": [{"type": "function", "name": "weather", "parameters": {"type": "object"}, "strict": true}],
        "tool_choice": {"type": "function", "name": "weather"},
        "parallel_tool_calls": false,
    }));
    let roles: Vec<&str> = chat["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "developer"]);
    assert_eq!(chat["messages"][1]["content"], "Weather in Paris?");
    let assistant = &chat["messages"][2];
    assert_eq!(assistant["reasoning_content"], "I should look it up.");
    assert_eq!(assistant["tool_calls"][0]["id"], "c1", "consecutive calls are one message's");
    assert_eq!(assistant["tool_calls"][1]["function"]["name"], "time");
    assert_eq!(chat["messages"][3]["content"], "sunny");
    assert_eq!(
        chat["tools"][0],
        json!({"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}, "strict": true}})
    );
    assert_eq!(chat["tool_choice"], json!({"type": "function", "function": {"name": "weather"}}));
    assert_eq!(chat["parallel_tool_calls"], false);
}

#[test]
fn what_this_server_cannot_do_is_refused_by_name() {
    let refused = |body: Value| match chat_request(body) {
        Err(e) => e.to_string(),
        Ok(_) => String::from("accepted"),
    };
    assert!(refused(json!({"input": "hi", "previous_response_id": "resp_1"})).contains("previous_response_id"));
    assert!(refused(json!({"input": "hi", "background": true})).contains("background"));
    assert!(refused(json!({"input": "hi", "tools": [{"type": "web_search"}]})).contains("only function tools"));
    assert!(
        refused(json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}))
            .contains("input_image")
    );
    assert!(refused(json!({"input": [{"type": "item_reference", "id": "x"}]})).contains("item_reference"));
    assert!(refused(json!({"instructions": "x"})).contains("`input` is required"));
    assert!(refused(json!({"input": "hi", "max_output_tokens": -1})).contains("`max_output_tokens` must be"));
    assert_eq!(refused(json!({"input": "hi", "store": false, "reasoning": {"effort": "low"}})), "accepted");
}

fn echo() -> Echo {
    Echo { id: String::from("resp_7"), model: String::from("m"), fields: serde_json::Map::new() }
}

#[test]
fn a_chat_reply_is_a_response_object() {
    let chat = json!({
        "model": "m",
        "choices": [{"message": {"role": "assistant", "content": "Looking.", "tool_calls": [
            {"id": "call_0_0", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}},
        ]}, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14, "prompt_tokens_details": {"cached_tokens": 8}},
    });
    let r = response_object(&chat, &echo());
    assert_eq!((&r["id"], &r["object"], &r["status"]), (&json!("resp_7"), &json!("response"), &json!("completed")));
    assert_eq!(r["output"][0]["content"][0]["text"], "Looking.");
    assert_eq!(r["output"][1]["type"], "function_call");
    assert_eq!((&r["output"][1]["call_id"], &r["output"][1]["name"]), (&json!("call_0_0"), &json!("weather")));
    assert_eq!(r["usage"]["input_tokens_details"]["cached_tokens"], 8);
    assert_eq!((&r["usage"]["input_tokens"], &r["usage"]["output_tokens"]), (&json!(10), &json!(4)));
    let cut =
        json!({"model": "m", "choices": [{"message": {"content": "abc"}, "finish_reason": "length"}], "usage": {}});
    let r = response_object(&cut, &echo());
    assert_eq!((&r["status"], &r["incomplete_details"]["reason"]), (&json!("incomplete"), &json!("max_output_tokens")));
}

#[test]
fn chat_chunks_become_the_responses_events_in_order() {
    let mut t = Translator::new(echo());
    let mut events = t.start();
    let chunk = |content: &str, finish: Value| json!({"model": "m", "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]});
    events.extend(
        t.chunk(&json!({"model": "m", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})),
    );
    events.extend(t.chunk(&chunk("Hel", Value::Null)));
    events.extend(t.chunk(&chunk("lo", Value::Null)));
    events.extend(t.chunk(&chunk("", json!("stop"))));
    events.extend(t.chunk(
        &json!({"model": "m", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}),
    ));
    events.extend(t.end());
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let numbers: Vec<u64> = events.iter().map(|e| e["sequence_number"].as_u64().unwrap()).collect();
    assert_eq!(numbers, (0..10).collect::<Vec<_>>());
    assert_eq!(events[6]["text"], "Hello");
    let done = &events[9]["response"];
    assert_eq!((&done["status"], &done["output"][0]["content"][0]["text"]), (&json!("completed"), &json!("Hello")));
    assert_eq!(done["usage"]["total_tokens"], 5);

    // A reply of tool calls alone: no message item, each call whole; an error fails the response.
    let mut t = Translator::new(echo());
    let call = json!({"index": 0, "id": "call_0_0", "type": "function", "function": {"name": "f", "arguments": "{}"}});
    let events =
        t.chunk(&json!({"choices": [{"delta": {"content": "", "tool_calls": [call]}, "finish_reason": "tool_calls"}]}));
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
        ]
    );
    let mut t = Translator::new(echo());
    let failed = t.chunk(&json!({"error": {"message": "engine stopped", "type": "internal_error"}}));
    assert_eq!(
        (&failed[0]["type"], &failed[0]["response"]["error"]["message"]),
        (&json!("response.failed"), &json!("engine stopped"))
    );
    assert!(t.end().is_empty(), "nothing after a failure");
}
