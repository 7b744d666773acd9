//! `inference.reasoning_parser`: a thinking model's reply (here the tiny model held to a thinking
//! shape by a grammar) split into `reasoning_content` and `content`, the same streamed or not, on
//! the chat route and as the Responses API's `reasoning` item; off by default.

use serde_json::{Value, json};

use crate::{Srv, start};

/// A Lark grammar for a reply that thinks (`<think>` a few letters `</think>`) and then answers (a
/// few digits), or (`opened`) one whose prompt opened the thinking; the tags are the tokenizer's
/// own tokens, named by id.
async fn thinking(srv: &Srv, opened: bool) -> Value {
    let id = |text: &'static str| async move {
        let (_, v) = srv.post("/tokenize", json!({"prompt": text})).await;
        let ids = crate::ids(&v["tokens"]);
        assert_eq!(ids.len(), 1, "{text} is one token");
        ids[0]
    };
    let (start, end) = (id("<think>").await, id("</think>").await);
    let open = if opened { String::new() } else { format!("<[{start}]> ") };
    json!({"grammar": format!("start: {open}/[a-c]{{2,4}}/ <[{end}]> /[0-9]{{2,3}}/")})
}

async fn chat(srv: &Srv, extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 40, "seed": 3});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let (status, v) = srv.post("/v1/chat/completions", body).await;
    assert_eq!(status, 200, "{v}");
    v
}

async fn sse(srv: &Srv, path: &str, body: Value) -> Vec<Value> {
    let r = srv.http.post(format!("{}{path}", srv.base)).json(&body).send().await.unwrap();
    let text = r.text().await.unwrap();
    text.lines().filter_map(|l| l.strip_prefix("data: ")).filter_map(|d| serde_json::from_str(d).ok()).collect()
}

#[tokio::test]
async fn a_thinking_reply_splits_into_reasoning_and_content_streamed_or_not() {
    let srv = start(|c| c.reasoning_parser = String::from("qwen3")).await;
    let grammar = thinking(&srv, false).await;
    let v = chat(&srv, json!({"structured_outputs": grammar})).await;
    let message = &v["choices"][0]["message"];
    let (thought, answer) = (message["reasoning_content"].as_str().unwrap(), message["content"].as_str().unwrap());
    assert!(thought.chars().all(|c| "abc".contains(c)) && (2..=4).contains(&thought.len()), "{message}");
    assert!(answer.chars().all(|c| c.is_ascii_digit()) && (2..=3).contains(&answer.len()), "{message}");
    assert_eq!(message["reasoning"], message["reasoning_content"]);

    let chunks = sse(
        &srv,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "2+2?"}],
        "max_tokens": 40, "seed": 3, "stream": true, "structured_outputs": grammar}),
    )
    .await;
    let joined =
        |field: &str| -> String { chunks.iter().filter_map(|c| c["choices"][0]["delta"][field].as_str()).collect() };
    assert_eq!((joined("reasoning_content"), joined("content")), (thought.to_owned(), answer.to_owned()));

    // The Responses API: a `reasoning` item before the message, streamed as reasoning_text deltas.
    let ask = json!({"input": "2+2?", "max_output_tokens": 40, "seed": 3, "structured_outputs": grammar});
    let (status, r) = srv.post("/v1/responses", ask.clone()).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(
        (&r["output"][0]["type"], &r["output"][0]["content"][0]["text"]),
        (&json!("reasoning"), &json!(thought))
    );
    assert_eq!(r["output"][1]["content"][0]["text"], answer);
    let mut streamed = ask;
    streamed["stream"] = json!(true);
    let events = sse(&srv, "/v1/responses", streamed).await;
    let deltas = |kind: &str| -> String {
        events.iter().filter(|e| e["type"] == kind).map(|e| e["delta"].as_str().unwrap()).collect()
    };
    assert_eq!(deltas("response.reasoning_text.delta"), thought);
    assert_eq!(deltas("response.output_text.delta"), answer);
    let texts = |output: &Value| -> Vec<Value> {
        output.as_array().unwrap().iter().map(|o| json!([o["type"].clone(), o["content"][0]["text"].clone()])).collect()
    };
    assert_eq!(texts(&events.last().unwrap()["response"]["output"]), texts(&r["output"]));
}

#[tokio::test]
async fn a_prompt_that_opened_the_thinking_and_the_parser_off() {
    let srv = start(|c| c.reasoning_parser = String::from("qwen3")).await;
    // The prompt ends inside `<think>` (a thinking model's template, here a prefill): the reply's
    // text up to `</think>` is reasoning though it never opens it.
    let v = chat(
        &srv,
        json!({"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "<think>"}],
               "continue_final_message": true, "structured_outputs": thinking(&srv, true).await}),
    )
    .await;
    let message = &v["choices"][0]["message"];
    let thought = message["reasoning_content"].as_str().unwrap_or_default();
    assert!((2..=4).contains(&thought.len()) && thought.chars().all(|c| "abc".contains(c)), "{message}");
    assert!(message["content"].as_str().unwrap().chars().all(|c| c.is_ascii_digit()), "{message}");

    // Off (the default, as vLLM's): the reply stays whole, with no reasoning fields.
    let srv = start(|_| {}).await;
    let v = chat(&srv, json!({"structured_outputs": thinking(&srv, false).await})).await;
    let message = &v["choices"][0]["message"];
    assert!(message["content"].as_str().unwrap().starts_with("<think>"), "{message}");
    assert!(message.get("reasoning_content").is_none(), "{message}");
}
