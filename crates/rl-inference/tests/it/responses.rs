//! `/v1/responses` (OpenAI's Responses API) over HTTP: the same reply as the chat route for the
//! same conversation, streamed as typed events whose text deltas add up to it, tool calls as
//! `function_call` items that a following request answers, and errors as OpenAI error objects.

use serde_json::{Value, json};

use crate::start;

const WEATHER: &str = r#"{"type": "function", "name": "weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}}"#;

#[tokio::test]
async fn a_response_is_the_chat_reply_to_the_same_conversation() {
    let srv = start(|_| {}).await;
    let (status, chat) = srv
        .post(
            "/v1/chat/completions",
            json!({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Reverse: abc"}],
                   "temperature": 0.0, "max_tokens": 12}),
        )
        .await;
    assert_eq!(status, 200, "{chat}");
    let request =
        json!({"instructions": "Be brief.", "input": "Reverse: abc", "temperature": 0.0, "max_output_tokens": 12});
    let (status, r) = srv.post("/v1/responses", request.clone()).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!((&r["object"], &r["model"]), (&json!("response"), &json!("tiny")));
    let text = r["output"][0]["content"][0]["text"].as_str().unwrap();
    assert_eq!(text, chat["choices"][0]["message"]["content"].as_str().unwrap());
    assert_eq!(r["usage"]["input_tokens"], chat["usage"]["prompt_tokens"]);
    assert_eq!(r["usage"]["output_tokens"], chat["usage"]["completion_tokens"]);
    let expected = if chat["choices"][0]["finish_reason"] == "length" { "incomplete" } else { "completed" };
    assert_eq!(r["status"], expected);
    assert_eq!((&r["instructions"], &r["max_output_tokens"]), (&json!("Be brief."), &json!(12)));

    // Streamed: typed events in order, their deltas adding up to the same text.
    let mut streamed = request;
    streamed["stream"] = json!(true);
    let body = srv.http.post(format!("{}/v1/responses", srv.base)).json(&streamed).send().await.unwrap();
    let body = body.text().await.unwrap();
    let events: Vec<Value> =
        body.lines().filter_map(|l| l.strip_prefix("data: ")).map(|d| serde_json::from_str(d).unwrap()).collect();
    let names: Vec<&str> = body.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(names, kinds, "each event is named by its type");
    assert_eq!(kinds.first(), Some(&"response.created"));
    assert_eq!(events[0]["response"]["model"], "tiny", "the model is known from the first event");
    assert_eq!(kinds.last(), Some(&format!("response.{expected}").as_str()));
    let deltas: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, text);
    let last = &events.last().unwrap()["response"];
    assert_eq!(
        (&last["output"][0]["content"][0]["text"], &last["usage"]["output_tokens"]),
        (&json!(text), &r["usage"]["output_tokens"])
    );
    let numbers: Vec<u64> = events.iter().map(|e| e["sequence_number"].as_u64().unwrap()).collect();
    assert_eq!(numbers, (0..events.len() as u64).collect::<Vec<_>>());
}

#[tokio::test]
async fn tool_calls_are_function_call_items_and_their_outputs_go_back_as_input() {
    let srv = start(|_| {}).await;
    let tool: Value = serde_json::from_str(WEATHER).unwrap();
    // vLLM's fields pass through as on the chat route: a bias keeps the tiny random model from
    // spending its tokens on JSON's optional spaces.
    let (_, spaces) = srv.post("/tokenize", json!({"prompt": " \n\t"})).await;
    let bias: serde_json::Map<String, Value> =
        crate::ids(&spaces["tokens"]).iter().map(|t| (t.to_string(), json!(-100))).collect();
    let (status, r) = srv
        .post(
            "/v1/responses",
            json!({"input": "Weather in Paris?", "tools": [tool], "tool_choice": {"type": "function", "name": "weather"},
                   "max_output_tokens": 64, "logit_bias": bias}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    let call = r["output"].as_array().unwrap().iter().find(|o| o["type"] == "function_call").cloned();
    let call = call.unwrap_or_else(|| panic!("a forced call: {r}"));
    assert_eq!(call["name"], "weather");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(args["city"] == "Paris" || args["city"] == "Rome", "{args}");
    // The conversation goes on with the call and its output, as a client sends them back.
    let input = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": call["call_id"], "name": "weather", "arguments": call["arguments"]},
        {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"},
    ]);
    let (status, r) = srv.post("/v1/responses", json!({"input": input, "tools": [tool], "max_output_tokens": 8})).await;
    assert_eq!(status, 200, "{r}");
    assert!(r["usage"]["input_tokens"].as_u64().unwrap() > 10);
}

#[tokio::test]
async fn what_it_cannot_do_is_a_400_naming_it() {
    let srv = start(|_| {}).await;
    for (body, says) in [
        (json!({"input": "hi", "previous_response_id": "resp_1"}), "previous_response_id"),
        (json!({"input": "hi", "tools": [{"type": "web_search"}]}), "only function tools"),
        (json!({"instructions": "hi"}), "`input` is required"),
        (json!({"input": "hi", "n": 2}), "`n` must be 1"),
    ] {
        let (status, err) = srv.post("/v1/responses", body).await;
        assert_eq!(status, 400, "{err}");
        assert!(err["error"]["message"].as_str().unwrap().contains(says), "{err}");
    }
}
