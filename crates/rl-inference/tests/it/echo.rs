//! `echo` on text completions: the prompt comes back before the completion, with its tokens'
//! logprobs, as lm-evaluation-harness's `local-completions` scores a continuation.

use serde_json::{Value, json};

use crate::{ids, start};

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echoed_prompts_carry_their_tokens_logprobs() {
    let srv = start(|_| {}).await;
    let (_, t) = srv.post("/tokenize", json!({"prompt": "hello world"})).await;
    let prompt = ids(&t["tokens"]);
    let n = prompt.len();
    // The engine's own prompt logprobs, for comparison.
    let (_, scored) =
        srv.post("/v1/completions", json!({"prompt": prompt, "max_tokens": 1, "prompt_logprobs": 1})).await;

    // lm-eval's request: the tokens, echo, one greedy token, one alternative.
    let body = json!({"prompt": prompt, "echo": true, "logprobs": 1, "max_tokens": 1, "temperature": 0.0});
    let (s, v) = srv.post("/v1/completions", body).await;
    assert_eq!(s, 200, "{v}");
    let choice = &v["choices"][0];
    assert!(choice["text"].as_str().unwrap().starts_with("hello world"), "{choice}");
    let lp = &choice["logprobs"];
    let token_logprobs = lp["token_logprobs"].as_array().unwrap();
    assert_eq!((token_logprobs.len(), lp["tokens"].as_array().unwrap().len()), (n + 1, n + 1), "{lp}");
    assert!(token_logprobs[0].is_null() && lp["top_logprobs"][0].is_null(), "{lp}");
    for i in 1..n {
        let want = f(&scored["prompt_logprobs"][i][prompt[i].to_string()]["logprob"]);
        assert!((f(&token_logprobs[i]) - want).abs() < 1e-5, "token {i}: {} vs {want}", token_logprobs[i]);
        // The token itself is among the alternatives, so lm-eval's greedy check can compare.
        let top = lp["top_logprobs"][i].as_object().unwrap();
        assert!(top.contains_key(lp["tokens"][i].as_str().unwrap()), "{top:?}");
        assert!(top.values().all(|x| f(x) <= 0.0));
    }
    // Each token's start in the returned text.
    let starts: Vec<u64> = lp["text_offset"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
    let mut at = 0;
    for (token, start) in lp["tokens"].as_array().unwrap().iter().zip(&starts) {
        assert_eq!(*start, at, "{lp}");
        at += token.as_str().unwrap().chars().count() as u64;
    }
    assert_eq!(starts.len(), n + 1);
    // lm-eval's sum over the continuation: the prompt's own scores, so a finite number.
    let total: f64 = token_logprobs[1..n].iter().map(f).sum();
    assert!(total.is_finite() && total < 0.0);

    // Scoring only (max_tokens = 0), a list of prompts, and echo without logprobs.
    let body = json!({"prompt": [prompt, &prompt[..3]], "echo": true, "logprobs": 0, "max_tokens": 0});
    let (s, v) = srv.post("/v1/completions", body).await;
    assert_eq!(s, 200, "{v}");
    for (choice, len) in v["choices"].as_array().unwrap().iter().zip([n, 3]) {
        assert_eq!(choice["logprobs"]["token_logprobs"].as_array().unwrap().len(), len, "{choice}");
    }
    let (_, v) = srv.post("/v1/completions", json!({"prompt": "hello world", "echo": true, "max_tokens": 2})).await;
    assert!(
        v["choices"][0]["text"].as_str().unwrap().starts_with("hello world") && v["choices"][0]["logprobs"].is_null(),
        "{v}"
    );

    for (path, body, named) in [
        ("/v1/completions", json!({"prompt": "a", "echo": true, "stream": true}), "echo"),
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "a"}], "echo": true}), "echo"),
    ] {
        let (s, v) = srv.post(path, body).await;
        assert_eq!(s, 400, "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(named), "{v}");
    }
}
