//! Structured outputs: every completion of a constrained request matches its JSON schema, regex,
//! choice or Lark grammar and ends there; the logprobs are those of the masked distribution; bad
//! constraints are 400s naming them.

use serde_json::{Value, json};

use crate::{Srv, ids, load, recompute, start};

fn chat(extra: &Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "Grade it."}], "max_tokens": 200,
        "temperature": 1.0, "seed": 11, "n": 4});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// Every choice's text (asserting each ended on its own, not at `max_tokens`).
async fn texts(srv: &Srv, path: &str, body: Value) -> Vec<String> {
    let (s, v) = srv.post(path, body.clone()).await;
    assert_eq!(s, 200, "{body}: {v}");
    v["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            assert_eq!(c["finish_reason"], "stop", "{body}: {c}");
            let text = c["message"]["content"].as_str().or(c["text"].as_str()).unwrap();
            text.to_owned()
        })
        .collect()
}

/// A bias that keeps the tiny random model from spending its tokens on JSON's optional spaces.
async fn no_whitespace(srv: &Srv) -> Value {
    let (_, v) = srv.post("/tokenize", json!({"prompt": " \n\t"})).await;
    let bias: serde_json::Map<String, Value> = ids(&v["tokens"]).iter().map(|t| (t.to_string(), json!(-100))).collect();
    Value::Object(bias)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_schemas_hold_for_every_choice_through_each_field() {
    let srv = start(|_| {}).await;
    let schema = json!({"type": "object", "additionalProperties": false, "required": ["verdict", "score", "tags"],
        "properties": {"verdict": {"enum": ["correct", "wrong"]}, "score": {"type": "integer", "minimum": 0, "maximum": 9},
                       "tags": {"type": "array", "maxItems": 2, "items": {"enum": ["a", "b"]}}}});
    let check = |text: &str| {
        let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?} is not JSON: {e}"));
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["verdict", "score", "tags"], "{text}");
        assert!(["correct", "wrong"].contains(&v["verdict"].as_str().unwrap()), "{text}");
        assert!(v["score"].as_u64().unwrap() <= 9, "{text}");
        assert!(v["tags"].as_array().unwrap().len() <= 2, "{text}");
    };
    let bias = no_whitespace(&srv).await;
    let fields = [
        json!({"response_format": {"type": "json_schema", "json_schema": {"name": "grade", "schema": schema, "strict": true}},
               "logit_bias": bias}),
        json!({"structured_outputs": {"json": schema.to_string(), "disable_any_whitespace": true}}),
        json!({"guided_json": schema, "logit_bias": bias}),
    ];
    for extra in fields {
        for text in texts(&srv, "/v1/chat/completions", chat(&extra)).await {
            check(&text);
        }
    }
    // Open by default (JSON Schema's rule: the random model adds keys); closed on request.
    let open = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]});
    let body = chat(&json!({"structured_outputs": {"json": open, "disable_any_whitespace": true,
        "disable_additional_properties": true}, "n": 8}));
    for text in texts(&srv, "/v1/chat/completions", body).await {
        assert!(text == r#"{"ok":true}"# || text == r#"{"ok":false}"#, "{text}");
    }
    // Any JSON object, on the text route too. The random model writes strings of any length, so
    // a choice cut at `max_tokens` is only checked to be an object's start.
    let body = json!({"prompt": "x", "max_tokens": 60, "temperature": 1.0, "seed": 2, "n": 8,
        "response_format": {"type": "json_object"}, "logit_bias": bias});
    let (s, v) = srv.post("/v1/completions", body).await;
    assert_eq!(s, 200, "{v}");
    let mut whole = 0;
    for c in v["choices"].as_array().unwrap() {
        let text = c["text"].as_str().unwrap();
        assert!(text.starts_with('{'), "{c}");
        if c["finish_reason"] == "stop" {
            let parsed: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert!(parsed.is_object(), "{text}");
            whole += 1;
        }
    }
    assert!(whole > 0, "no choice ended within 60 tokens: {v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regexes_choices_and_grammars_hold_and_streams_carry_the_same_text() {
    let srv = start(|_| {}).await;
    for text in
        texts(&srv, "/v1/chat/completions", chat(&json!({"structured_outputs": {"regex": "[a-c]{3}-[0-9]{2}"}}))).await
    {
        assert!(text.len() == 6 && text[..3].chars().all(|c| ('a'..='c').contains(&c)), "{text}");
        assert!(text.as_bytes()[3] == b'-' && text[4..].chars().all(|c| c.is_ascii_digit()), "{text}");
    }
    let options = ["yes", "no", "not sure (ask again)"];
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..3 {
        let body = chat(&json!({"guided_choice": options, "seed": seed, "temperature": 1.5}));
        for text in texts(&srv, "/v1/chat/completions", body).await {
            assert!(options.contains(&text.as_str()), "{text}");
            seen.insert(text);
        }
    }
    assert!(seen.len() >= 2, "sampling among the choices, not always one: {seen:?}");
    let grammar = "start: greeting \" \" name \"!\"\ngreeting: \"hi\" | \"hello\"\nname: /[A-Z][a-z]{1,3}/\n";
    for text in texts(&srv, "/v1/chat/completions", chat(&json!({"structured_outputs": {"grammar": grammar}}))).await {
        let (greeting, name) =
            text.strip_suffix('!').and_then(|t| t.split_once(' ')).unwrap_or_else(|| panic!("{text}"));
        assert!(["hi", "hello"].contains(&greeting), "{text}");
        assert!(name.len() >= 2 && name.len() <= 4 && name.starts_with(|c: char| c.is_ascii_uppercase()), "{text}");
    }

    // Streamed: the deltas make the same constrained text as the whole reply.
    let body = chat(&json!({"guided_regex": "[0-9]{4}", "n": 1, "seed": 5}));
    let whole = texts(&srv, "/v1/chat/completions", body.clone()).await.remove(0);
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let sse = srv.http.post(format!("{}/v1/chat/completions", srv.base)).json(&streamed).send().await.unwrap();
    let sse = sse.text().await.unwrap();
    let deltas: String = sse
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(deltas, whole);
    assert!(whole.len() == 4 && whole.chars().all(|c| c.is_ascii_digit()), "{whole}");
}

/// With a choice of two strings that differ in their first character, the first token's logprob
/// is its share of the two tokens' probabilities (the masked, renormalised distribution), as a
/// full forward pass recomputes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_are_those_of_the_masked_distribution() {
    let srv = start(|_| {}).await;
    let body = chat(&json!({"guided_choice": ["yes", "no"], "n": 1, "temperature": 0.8, "logprobs": true,
        "return_token_ids": true}));
    let (s, v) = srv.post("/v1/chat/completions", body).await;
    assert_eq!(s, 200, "{v}");
    let prompt = ids(&v["prompt_token_ids"]);
    let first = v["choices"][0]["logprobs"]["content"][0]["logprob"].as_f64().unwrap() as f32;
    let token = ids(&v["choices"][0]["token_ids"])[0];
    let (_, y) = srv.post("/tokenize", json!({"prompt": "y"})).await;
    let (_, n) = srv.post("/tokenize", json!({"prompt": "n"})).await;
    let (y, n) = (ids(&y["tokens"])[0], ids(&n["tokens"])[0]);
    assert!(token == y || token == n, "{v}");
    let model = load(&srv.model_dir());
    let lp = |t: u32| recompute(&model, &prompt, &[t], 0.8)[0];
    let (ly, ln) = (lp(y), lp(n));
    let norm = ly.max(ln) + ((ly - ly.max(ln)).exp() + (ln - ly.max(ln)).exp()).ln();
    let want = lp(token) - norm;
    assert!((first - want).abs() < 1e-4, "served {first}, masked recomputation {want}");
    // The characters after it are forced, so certain under the mask (the end token after them
    // is one of the model's end-of-sequence ids, so not certain).
    let tokens = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    for t in &tokens[1..tokens.len() - 1] {
        assert!(t["logprob"].as_f64().unwrap() > -1e-4, "{t}");
    }
}

#[tokio::test]
async fn bad_constraints_are_400s_naming_them() {
    let srv = start(|_| {}).await;
    for (extra, named) in [
        (json!({"structured_outputs": {"regex": "([a-z"}}), "structured-output constraint"),
        (json!({"guided_grammar": "start: undefined_rule"}), "structured-output constraint"),
        (
            json!({"guided_json": {"type": "object", "required": ["a"], "properties": {"a": false}}}),
            "structured-output",
        ),
        (json!({"response_format": {"type": "structural_tag"}}), "response_format"),
        (json!({"guided_regex": "a", "guided_choice": ["b"]}), "guided_choice"),
        (json!({"structured_outputs": {"whitespace_pattern": " "}}), "structured_outputs.whitespace_pattern"),
        (json!({"structured_outputs": "json"}), "structured_outputs"),
    ] {
        let (s, v) = srv.post("/v1/chat/completions", chat(&extra)).await;
        assert_eq!(s, 400, "{extra}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(named), "{extra}: {v}");
    }
    // A complete match must end, and `min_tokens` forbids ending: nothing can be sampled.
    let (s, v) = srv.post("/v1/chat/completions", chat(&json!({"guided_choice": ["ok"], "min_tokens": 5}))).await;
    assert_eq!(s, 400, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("min_tokens"), "{v}");
    // Text no token of the vocabulary spells (the test tokenizer has no `¡`): nothing can be
    // sampled, on either route, and the server says so instead of failing inside.
    // Forced text (one choice) and text no token starts (a class) alike.
    for constraint in [json!({"guided_choice": ["\u{a1}"]}), json!({"guided_regex": "ok[\u{a1}\u{a2}]"})] {
        for path in ["/v1/chat/completions", "/v1/completions"] {
            let body = if path == "/v1/completions" {
                let mut body = json!({"prompt": "hi", "max_tokens": 4});
                body.as_object_mut().unwrap().extend(constraint.as_object().unwrap().clone());
                body
            } else {
                chat(&constraint)
            };
            let (s, v) = srv.post(path, body).await;
            assert_eq!(s, 400, "{path} {constraint}: {v}");
            assert!(v["error"]["message"].as_str().unwrap().contains("no token"), "{path} {constraint}: {v}");
        }
    }
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "weather", "parameters": {"type": "object",
            "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "add", "parameters": {"type": "object",
            "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                           "b": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["a", "b"]}}},
    ])
}

/// The calls of every choice (asserting the choice ended with calls and no other content).
fn calls_of(v: &Value) -> Vec<Vec<(String, Value)>> {
    v["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            assert_eq!(c["finish_reason"], "tool_calls", "{c}");
            assert_eq!(c["message"]["content"], "", "{c}");
            c["message"]["tool_calls"]
                .as_array()
                .unwrap()
                .iter()
                .map(|call| {
                    let args = call["function"]["arguments"].as_str().unwrap();
                    let args: Value = serde_json::from_str(args).unwrap_or_else(|e| panic!("{call}: {e}"));
                    (call["function"]["name"].as_str().unwrap().to_owned(), args)
                })
                .collect()
        })
        .collect()
}

fn check_call(name: &str, args: &Value) {
    match name {
        "weather" => assert!(["Paris", "Rome"].contains(&args["city"].as_str().unwrap()), "{args}"),
        "add" => assert!(args["a"].as_u64().unwrap() <= 9 && args["b"].as_u64().unwrap() <= 9, "{args}"),
        other => panic!("called {other}"),
    }
}

/// A `tool_choice = "required"` reply of `n` choices, each one or more valid calls (one at most
/// unless `parallel`).
async fn required_calls(srv: &Srv, n: u32, parallel: bool) -> Value {
    let bias = no_whitespace(srv).await;
    let body = chat(&json!({"tools": tools(), "tool_choice": "required", "logit_bias": bias, "n": n,
        "return_token_ids": true, "parallel_tool_calls": parallel}));
    let (s, v) = srv.post("/v1/chat/completions", body).await;
    assert_eq!(s, 200, "{v}");
    for calls in calls_of(&v) {
        assert!(!calls.is_empty());
        for (name, args) in &calls {
            check_call(name, args);
        }
    }
    v
}

/// `tool_choice = "required"` and a named function constrain the reply to calls in the template's
/// own format (parsed back as `tool_calls`, streamed or not) whose arguments match the tool's
/// parameters; without tools, or naming an absent tool, they are 400s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_choice_required_and_named_constrain_the_reply_to_valid_calls() {
    let srv = start(|_| {}).await;
    let bias = no_whitespace(&srv).await;
    required_calls(&srv, 6, true).await;
    for calls in calls_of(&required_calls(&srv, 6, false).await) {
        assert_eq!(calls.len(), 1, "parallel_tool_calls = false: {calls:?}");
    }
    let named = json!({"type": "function", "function": {"name": "add"}});
    let body = chat(&json!({"tools": tools(), "tool_choice": named, "logit_bias": bias, "n": 4}));
    let (s, v) = srv.post("/v1/chat/completions", body.clone()).await;
    assert_eq!(s, 200, "{v}");
    for calls in calls_of(&v) {
        assert_eq!(calls.len(), 1, "{calls:?}");
        assert_eq!(calls[0].0, "add");
        check_call("add", &calls[0].1);
    }
    // Streamed: the calls come in the last chunk, as the unconstrained tool replies do.
    let mut streamed = body;
    streamed["stream"] = json!(true);
    streamed["n"] = json!(1);
    let sse = srv.http.post(format!("{}/v1/chat/completions", srv.base)).json(&streamed).send().await.unwrap();
    let sse = sse.text().await.unwrap();
    let chunks: Vec<Value> = sse
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .collect();
    let last = chunks.iter().rev().find(|c| !c["choices"][0]["finish_reason"].is_null()).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "tool_calls", "{last}");
    assert_eq!(last["choices"][0]["delta"]["tool_calls"][0]["function"]["name"], "add", "{last}");

    for (extra, named) in [
        (json!({"tool_choice": "required"}), "no tools"),
        (json!({"tools": tools(), "tool_choice": {"type": "function", "function": {"name": "nope"}}}), "\"nope\""),
        (json!({"tools": tools(), "tool_choice": "required", "guided_regex": "a"}), "cannot be combined"),
        (json!({"tools": tools(), "tool_choice": "sometimes"}), "sometimes"),
    ] {
        let (s, v) = srv.post("/v1/chat/completions", chat(&extra)).await;
        assert_eq!(s, 400, "{extra}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(named), "{extra}: {v}");
    }
}

/// With `tool_call_parser = "llama3_json"` (what `auto` picks for a Llama 3.1 template), forced
/// calls are written and parsed as Llama's `{"name", "parameters"}` objects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama_style_calls_are_forced_and_parsed_in_their_own_format() {
    let srv = start(|c| c.tool_call_parser = String::from("llama3_json")).await;
    let v = required_calls(&srv, 4, true).await;
    let (_, text) = srv.post("/detokenize", json!({"tokens": v["choices"][0]["token_ids"]})).await;
    let text = text["prompt"].as_str().unwrap();
    assert!(text.starts_with(r#"{"name":"#) && text.contains(r#""parameters":"#), "{text}");
}
