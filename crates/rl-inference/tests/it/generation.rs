//! Generation: logprobs of the sampled distribution, seeds, concurrency, prompt logprobs, errors.

use serde_json::json;

use crate::{ids, load, recompute, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_equal_log_softmax_of_scaled_logits_from_a_full_forward() {
    let srv = start(|_| {}).await;
    let model = load(&srv.model_dir());
    for (t, seed) in [(0.7f32, 5u64), (1.0, 6), (1.6, 7)] {
        let (s, v) = srv
            .post(
                "/v1/chat/completions",
                json!({"messages": [{"role": "system", "content": "Reverse it."}, {"role": "user", "content": "hello"}],
                       "temperature": t, "seed": seed, "max_completion_tokens": 12, "logprobs": true, "return_token_ids": true}),
            )
            .await;
        assert_eq!(s, 200, "{v}");
        let prompt = ids(&v["prompt_token_ids"]);
        let completion = ids(&v["choices"][0]["token_ids"]);
        let returned: Vec<f32> = v["choices"][0]["logprobs"]["content"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["logprob"].as_f64().unwrap() as f32)
            .collect();
        assert_eq!(returned.len(), completion.len());
        let want = recompute(&model, &prompt, &completion, t);
        for (k, (a, b)) in returned.iter().zip(&want).enumerate() {
            assert!((a - b).abs() < 1e-4, "T={t} token {k}: server {a}, recomputed {b}");
        }
        assert!(["stop", "length"].contains(&v["choices"][0]["finish_reason"].as_str().unwrap()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bf16_server_on_the_cpu_serves_the_model_rounded_to_bf16() {
    // `dtype = "bf16"` on the CPU packs every matrix in bf16 (activations stay f32): its logprobs
    // are the f32 model's with the matrices rounded, and not the unrounded model's.
    let srv = start(|c| c.dtype = rl_configs::Dtype::Bf16).await;
    let dir = srv.model_dir();
    let cfg = rl_model::read_config(&dir).unwrap();
    let rounded: std::collections::HashMap<String, candle_core::Tensor> =
        rl_model::read_weights(&dir, &candle_core::Device::Cpu)
            .unwrap()
            .into_iter()
            .map(|(k, t)| {
                let t = if t.rank() == 2 {
                    t.to_dtype(candle_core::DType::BF16).unwrap().to_dtype(candle_core::DType::F32).unwrap()
                } else {
                    t
                };
                (k, t)
            })
            .collect();
    let model = rl_model::model_from_weights(&cfg, &dir, rounded, &candle_core::Device::Cpu).unwrap();
    let plain = load(&dir);
    let (s, v) = srv
        .post(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hello"}], "temperature": 1.0, "seed": 3,
                   "max_completion_tokens": 12, "logprobs": true, "return_token_ids": true}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let (prompt, completion) = (ids(&v["prompt_token_ids"]), ids(&v["choices"][0]["token_ids"]));
    let returned: Vec<f32> = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["logprob"].as_f64().unwrap() as f32)
        .collect();
    let (want, unrounded) =
        (recompute(&model, &prompt, &completion, 1.0), recompute(&plain, &prompt, &completion, 1.0));
    let diff = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    assert!(diff(&returned, &want) < 1e-4, "server {returned:?}, rounded model {want:?}");
    assert!(diff(&returned, &unrounded) > diff(&returned, &want), "rounding made no difference");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_seed_gives_the_same_sample() {
    let srv = start(|_| {}).await;
    let req = |seed: u64| json!({"messages": [{"role": "user", "content": "abc"}], "seed": seed, "max_completion_tokens": 16, "return_token_ids": true, "n": 2});
    let a = srv.post("/v1/chat/completions", req(1)).await.1;
    let b = srv.post("/v1/chat/completions", req(1)).await.1;
    assert_eq!(a["choices"], b["choices"]);
    let others: Vec<_> = [2u64, 3, 4].iter().map(|s| req(*s)).collect();
    let mut differs = false;
    for r in others {
        differs |=
            srv.post("/v1/chat/completions", r).await.1["choices"][0]["token_ids"] != a["choices"][0]["token_ids"];
    }
    assert!(differs, "different seeds should give different samples");
    assert_ne!(a["choices"][0]["token_ids"], a["choices"][1]["token_ids"], "n choices use different seeds");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_are_answered_as_if_alone() {
    let srv = start(|c| c.max_batch_size = 4).await;
    let prompts = ["a", "bb", "a longer prompt here", "x y z", "qq", "the end"];
    let together = futures::future::join_all(prompts.iter().map(|p| srv.greedy(p))).await;
    for (p, got) in prompts.iter().zip(together) {
        assert_eq!(got, srv.greedy(p).await, "prompt {p:?}");
    }
}

#[tokio::test]
async fn prompt_logprobs_score_a_given_sequence() {
    let srv = start(|_| {}).await;
    let model = load(&srv.model_dir());
    let prompt = vec![1u32, 40, 50, 60, 70, 2];
    let (s, v) = srv
        .post(
            "/v1/completions",
            json!({"prompt": prompt, "max_tokens": 0, "prompt_logprobs": 0, "return_token_ids": true}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let items = v["prompt_logprobs"].as_array().unwrap();
    assert!(items[0].is_null());
    let want = recompute(&model, &prompt[..1], &prompt[1..], 1.0);
    for (k, id) in prompt.iter().enumerate().skip(1) {
        let got = items[k][id.to_string()]["logprob"].as_f64().unwrap() as f32;
        assert!((got - want[k - 1]).abs() < 1e-4, "token {k}: {got} vs {}", want[k - 1]);
    }
    assert_eq!(v["choices"][0]["token_ids"], json!([]));
}

#[tokio::test]
async fn bad_requests_get_clean_client_errors() {
    let srv = start(|c| {
        c.max_model_len = Some(64);
        c.max_request_bytes = 4096;
    })
    .await;
    let chat = |extra: serde_json::Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "hi"}]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let (s, v) = srv.post("/v1/chat/completions", chat(json!({"temperature": 3.0}))).await;
    assert_eq!(s, 400, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("temperature"));
    let (s, v) = srv
        .post("/v1/chat/completions", chat(json!({"messages": [{"role": "user", "content": "x".repeat(100)}]})))
        .await;
    assert_eq!(s, 400);
    assert!(v["error"]["message"].as_str().unwrap().contains("maximum context length"), "{v}");
    let (s, _) = srv.post("/v1/chat/completions", chat(json!({"model": "gpt-9"}))).await;
    assert_eq!(s, 404);
    let (s, _) = srv.post("/v1/chat/completions", chat(json!({"stream": true, "temperature": 9.0}))).await;
    assert_eq!(s, 400, "a streamed request is validated before its stream starts");
    let (s, _) = srv.post("/v1/chat/completions", chat(json!({"max_completion_tokens": 1000}))).await;
    assert_eq!(s, 400);
    let (s, _) = srv
        .post("/v1/chat/completions", chat(json!({"messages": [{"role": "user", "content": "y".repeat(5000)}]})))
        .await;
    assert_eq!(s, 413, "oversized bodies are refused");
    // Within the body limit but far beyond the context: refused before tokenizing.
    let (s, v) = srv
        .post("/v1/chat/completions", chat(json!({"messages": [{"role": "user", "content": "z".repeat(3000)}]})))
        .await;
    assert_eq!(s, 400);
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("maximum context length") && message.contains("at least"), "{message}");
    let r = srv
        .http
        .post(format!("{}/v1/chat/completions", srv.base))
        .body("{not json")
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = r.json().await.expect("malformed JSON gets the OpenAI error object");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    let (s, v) = srv.post("/v1/chat/completions", json!({"messages": "not a list"})).await;
    assert_eq!(s, 400, "a wrongly typed field is a 400 with the error object, not a plain 422: {v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("messages"), "{v}");
    let (s, v) = srv.post("/v1/completions", json!({"prompt": [100000]})).await;
    assert_eq!(s, 400, "unknown token ids: {v}");
    // Unknown routes and wrong methods answer with the error object too.
    let (s, v) = srv.post("/v1/embeddings", json!({})).await;
    assert_eq!((s, v["error"]["type"].as_str()), (404, Some("not_found_error")), "{v}");
    let r = srv.http.get(format!("{}/v1/chat/completions", srv.base)).send().await.unwrap();
    assert_eq!(r.status(), 405);
    let v: serde_json::Value = r.json().await.unwrap();
    assert!(v["error"]["message"].as_str().unwrap().contains("GET"), "{v}");
}

/// Six concurrent requests with one prompt (a GRPO group), then a next turn that extends it.
async fn group_then_next_turn(srv: &crate::Srv) -> Vec<serde_json::Value> {
    let first = json!([{"role": "system", "content": "Reverse the text."}, {"role": "user", "content": "a quick fox"}]);
    let next = json!([{"role": "system", "content": "Reverse the text."}, {"role": "user", "content": "a quick fox"},
                      {"role": "assistant", "content": "xof kciuq a"}, {"role": "user", "content": "and again"}]);
    let req = |messages: &serde_json::Value, seed: u64| {
        json!({"messages": messages, "temperature": 1.0, "seed": seed, "max_completion_tokens": 12,
               "logprobs": true, "return_token_ids": true})
    };
    let group = futures::future::join_all((0..6).map(|s| srv.post("/v1/chat/completions", req(&first, s)))).await;
    let mut out: Vec<serde_json::Value> =
        group.into_iter().map(|(s, v)| if s == 200 { v } else { panic!("{s}: {v}") }).collect();
    out.push(srv.post("/v1/chat/completions", req(&next, 9)).await.1);
    out
}

/// The prompt cache must not change a token or move a logprob (against a server without it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prompt_cache_changes_no_token_and_no_logprob() {
    let (cached, plain) = (start(|_| {}).await, start(|c| c.prefix_cache_mib = 0).await);
    let (a, b) = (group_then_next_turn(&cached).await, group_then_next_turn(&plain).await);
    let lp = |v: &serde_json::Value| -> Vec<f64> {
        v["choices"][0]["logprobs"]["content"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["logprob"].as_f64().unwrap())
            .collect()
    };
    let cached = |v: &serde_json::Value| v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    let prompt_len = a[0]["usage"]["prompt_tokens"].as_u64().unwrap();
    let hits = a[..6].iter().filter(|v| cached(v) == prompt_len - 1).count();
    assert!(hits >= 5, "all but the first of the group should reuse its prompt: {hits} did");
    assert!(cached(&a[6]) >= prompt_len - 1, "the next turn should reuse the first turn's prompt");
    assert!(b.iter().all(|v| cached(v) == 0), "nothing is cached with prefix_cache_mib = 0");
    for (k, (x, y)) in a.iter().zip(&b).enumerate() {
        assert_eq!(x["choices"][0]["token_ids"], y["choices"][0]["token_ids"], "request {k}");
        for (p, q) in lp(x).iter().zip(lp(y)) {
            assert!((p - q).abs() < 1e-5, "request {k}: {p} vs {q}");
        }
    }
}

#[tokio::test]
async fn temperatures_below_the_floor_are_refused_and_nan_is_never_served() {
    let srv = start(|_| {}).await;
    let chat = |t: f64| json!({"messages": [{"role": "user", "content": "hi"}], "temperature": t, "max_tokens": 4});
    for t in [1e-40, 1e-3, -0.5] {
        let (s, v) = srv.post("/v1/chat/completions", chat(t)).await;
        assert_eq!(s, 400, "temperature {t}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("0.01"), "{v}");
    }
    let (s, v) = srv.post("/v1/chat/completions", chat(0.01)).await;
    assert_eq!(s, 200, "the floor itself is served: {v}");

    // A model whose final norm is NaN: every logit is NaN, and the request fails instead of a 200
    // with null logprobs.
    let weights = srv.model_dir().join("model.safetensors");
    let mut tensors = candle_core::safetensors::load(&weights, &candle_core::Device::Cpu).unwrap();
    let norm = tensors.get_mut("model.norm.weight").expect("final norm weight");
    *norm = (norm.ones_like().unwrap() * f64::NAN).unwrap();
    let nan_dir = srv.dir.path().join("nan");
    std::fs::create_dir_all(&nan_dir).unwrap();
    for f in std::fs::read_dir(srv.model_dir()).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, nan_dir.join(f.file_name().unwrap())).unwrap();
    }
    candle_core::safetensors::save(&tensors, nan_dir.join("model.safetensors")).unwrap();
    let nan = start(|c| c.model.path = Some(nan_dir)).await;
    for body in [chat(1.0), chat(0.0), json!({"prompt": "ab", "max_tokens": 0, "prompt_logprobs": 1})] {
        let path = if body.get("prompt").is_some() { "/v1/completions" } else { "/v1/chat/completions" };
        let (s, v) = nan.post(path, body).await;
        assert_eq!(s, 500, "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("non-finite"), "{v}");
    }
}

/// The sampling parameters vLLM users send change the output as in vLLM or are refused by name:
/// `logit_bias` forces a token, `frequency_penalty` / `repetition_penalty` stop greedy repeats,
/// `min_p = 1` samples greedily, `ignore_eos` and `min_tokens` keep end-of-sequence from ending the
/// reply, the reported logprobs are those of the adjusted distribution, and
/// an unknown `response_format`, `tool_choice = "required"` and out-of-range values are 400s
/// naming them.
#[tokio::test]
async fn sampling_parameters_change_the_output_or_are_refused_by_name() {
    let srv = start(|_| {}).await;
    let chat = |extra: serde_json::Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "abcabc"}], "max_tokens": 12,
            "temperature": 0.0, "logprobs": true, "return_token_ids": true});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let ids_of = |v: &serde_json::Value| ids(&v["choices"][0]["token_ids"]);
    let (s, plain) = srv.post("/v1/chat/completions", chat(json!({}))).await;
    assert_eq!(s, 200, "{plain}");
    let plain_ids = ids_of(&plain);

    // A bias of +100 on one token makes greedy decoding emit it at once, with logprob ~0.
    let forced = (plain_ids[0] + 1) % 64;
    let (s, v) = srv.post("/v1/chat/completions", chat(json!({"logit_bias": {forced.to_string(): 100}}))).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(ids_of(&v)[0], forced);
    assert!(v["choices"][0]["logprobs"]["content"][0]["logprob"].as_f64().unwrap() > -1e-3, "{v}");

    // Penalties on repeated tokens: the greedy output repeats less (the tiny random model repeats).
    let distinct = |ids: &[u32]| ids.iter().collect::<std::collections::BTreeSet<_>>().len();
    for penalty in [json!({"frequency_penalty": 2.0}), json!({"repetition_penalty": 10.0})] {
        let (s, v) = srv.post("/v1/chat/completions", chat(penalty.clone())).await;
        assert_eq!(s, 200, "{v}");
        assert_ne!(ids_of(&v), plain_ids, "{penalty} changes the output");
        assert!(distinct(&ids_of(&v)) >= distinct(&plain_ids), "{penalty}: {:?} vs {plain_ids:?}", ids_of(&v));
    }
    // min_p = 1 keeps only the most likely token: sampling at T = 1 is greedy.
    let (_, v) = srv.post("/v1/chat/completions", chat(json!({"temperature": 1.0, "min_p": 1.0, "seed": 3}))).await;
    assert_eq!(ids_of(&v), plain_ids);

    // vLLM's `ignore_eos` and `min_tokens`: with the end-of-sequence token (2) forced, greedy
    // decoding stops at once; `ignore_eos` runs to max_tokens; `min_tokens = 5` masks it (it
    // cannot be sampled, so the first 5 tokens are others) and the 6th token ends the reply.
    let eos = json!({"logit_bias": {"2": 100}});
    let (_, v) = srv.post("/v1/chat/completions", chat(eos.clone())).await;
    assert_eq!((ids_of(&v), v["choices"][0]["finish_reason"].as_str()), (vec![2], Some("stop")), "{v}");
    let (_, v) = srv.post("/v1/chat/completions", chat(json!({"logit_bias": {"2": 100}, "ignore_eos": true}))).await;
    assert_eq!((ids_of(&v).len(), v["choices"][0]["finish_reason"].as_str()), (12, Some("length")), "{v}");
    assert!(ids_of(&v).iter().all(|&t| t == 2), "{v}");
    let (_, v) = srv.post("/v1/chat/completions", chat(json!({"logit_bias": {"2": 100}, "min_tokens": 5}))).await;
    let got = ids_of(&v);
    assert_eq!((got.len(), got[5], v["choices"][0]["finish_reason"].as_str()), (6, 2, Some("stop")), "{v}");
    assert!(got[..5].iter().all(|&t| t != 2), "{v}");

    // vLLM's `allowed_token_ids`: only those are sampled (no end-of-sequence among them, so the
    // reply runs to max_tokens); `include_stop_str_in_output` keeps the stop string in the text.
    let (_, v) =
        srv.post("/v1/chat/completions", chat(json!({"temperature": 1.0, "allowed_token_ids": [10, 11]}))).await;
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    assert!(ids_of(&v).iter().all(|t| [10, 11].contains(t)) && ids_of(&v).len() == 12, "{v}");
    let text = plain["choices"][0]["message"]["content"].as_str().unwrap();
    let stop: String = text.chars().skip(2).take(2).collect();
    let at = text.find(&stop).unwrap();
    for (include, want) in [(false, &text[..at]), (true, &text[..at + stop.len()])] {
        let body = chat(json!({"stop": [stop], "include_stop_str_in_output": include}));
        let (_, v) = srv.post("/v1/chat/completions", body).await;
        assert_eq!(v["choices"][0]["message"]["content"], want, "include {include}: {v}");
    }

    for (extra, named) in [
        (json!({"min_tokens": 13}), "min_tokens"),
        (json!({"allowed_token_ids": []}), "allowed_token_ids"),
        (json!({"allowed_token_ids": [999999]}), "allowed_token_ids"),
        (json!({"response_format": {"type": "structural_tag"}}), "response_format"),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (json!({"presence_penalty": 3.0}), "presence_penalty"),
        (json!({"repetition_penalty": 0.0}), "repetition_penalty"),
        (json!({"min_p": 1.5}), "min_p"),
        (json!({"skip_special_tokens": true}), "skip_special_tokens"),
        (json!({"logit_bias": {"999999": 1}}), "logit_bias"),
        (json!({"chat_template_kwargs": {"messages": []}}), "chat_template_kwargs"),
    ] {
        let (s, v) = srv.post("/v1/chat/completions", chat(extra.clone())).await;
        assert_eq!(s, 400, "{extra}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(named), "{extra}: {v}");
    }
    let (s, _) = srv
        .post("/v1/chat/completions", chat(json!({"response_format": {"type": "text"}, "tool_choice": "none"})))
        .await;
    assert_eq!(s, 200);
}

/// `/v1/completions` with a list of prompts (strings or token-id lists) answers `n` choices per
/// prompt, indexed prompt by prompt, each as that prompt alone would get; mixing ids and prompts
/// is a 400.
#[tokio::test]
async fn a_list_of_prompts_gets_choices_for_each() {
    let srv = start(|_| {}).await;
    let body = |prompt: serde_json::Value| json!({"prompt": prompt, "max_tokens": 5, "temperature": 0.0, "n": 2, "return_token_ids": true});
    let (s, alone) = srv.post("/v1/completions", body(json!("cd"))).await;
    assert_eq!(s, 200, "{alone}");
    let (s, v) = srv.post("/v1/completions", body(json!(["ab", "cd"]))).await;
    assert_eq!(s, 200, "{v}");
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    assert_eq!(choices.iter().map(|c| c["index"].as_u64().unwrap()).collect::<Vec<_>>(), [0, 1, 2, 3]);
    assert_eq!(choices[2]["text"], alone["choices"][0]["text"], "the second prompt's first choice");
    assert_eq!(choices[3]["prompt_token_ids"], alone["prompt_token_ids"]);
    let generated: u64 = choices.iter().map(|c| c["token_ids"].as_array().unwrap().len() as u64).sum();
    assert_eq!(v["usage"]["completion_tokens"].as_u64(), Some(generated));
    let ids = ids(&alone["prompt_token_ids"]);
    let (s, v) = srv.post("/v1/completions", body(json!([ids.clone(), ids]))).await;
    assert_eq!((s, v["choices"].as_array().map(Vec::len)), (200, Some(4)), "{v}");
    let (s, v) = srv.post("/v1/completions", body(json!([1, "a"]))).await;
    assert_eq!(s, 400, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("mixes"), "{v}");
}

/// The data payloads of a server-sent-event body.
fn sse_data(body: &str) -> Vec<String> {
    body.lines().filter_map(|l| l.strip_prefix("data: ")).map(str::to_owned).collect()
}

/// `stream = true` sends OpenAI chunks whose deltas add up to exactly the non-streamed text (stop
/// strings included: text that could still become one is held back), with one logprob per token,
/// a usage chunk on request and `[DONE]`; text completions stream the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_deltas_add_up_to_the_whole_reply() {
    let srv = start(|_| {}).await;
    for stop in [None, Some("b")] {
        let mut body = json!({"messages": [{"role": "user", "content": "stream this"}], "max_tokens": 16,
            "temperature": 0.0, "logprobs": true, "n": 2});
        if let Some(s) = stop {
            body["stop"] = json!([s]);
        }
        let (s, whole) = srv.post("/v1/chat/completions", body.clone()).await;
        assert_eq!(s, 200, "{whole}");
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let r = srv.http.post(format!("{}/v1/chat/completions", srv.base)).json(&body).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert!(r.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
        let data = sse_data(&r.text().await.unwrap());
        assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
        let chunks: Vec<serde_json::Value> =
            data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
        for i in 0..2 {
            let mine = chunks.iter().flat_map(|c| c["choices"].as_array().unwrap()).filter(|c| c["index"] == i);
            let (mut text, mut logprobs, mut finish) = (String::new(), 0, None);
            for c in mine {
                text.push_str(c["delta"]["content"].as_str().unwrap_or(""));
                logprobs += c["logprobs"]["content"].as_array().map_or(0, Vec::len);
                if let Some(f) = c["finish_reason"].as_str() {
                    finish = Some(f.to_owned());
                }
            }
            let expected = &whole["choices"][i]["message"]["content"];
            assert_eq!(text, expected.as_str().unwrap(), "stop {stop:?}, choice {i}");
            assert_eq!(logprobs, whole["choices"][i]["logprobs"]["content"].as_array().unwrap().len());
            assert_eq!(finish.as_deref(), whole["choices"][i]["finish_reason"].as_str());
        }
        let last = chunks.last().unwrap();
        for k in ["prompt_tokens", "completion_tokens", "total_tokens"] {
            assert_eq!(last["usage"][k], whole["usage"][k], "the usage chunk's {k}");
        }
        assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk" && c["id"] == chunks[0]["id"]));
    }
    let body = json!({"prompt": "ab", "max_tokens": 8, "temperature": 0.0});
    let (_, whole) = srv.post("/v1/completions", body.clone()).await;
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let r = srv.http.post(format!("{}/v1/completions", srv.base)).json(&streamed).send().await.unwrap();
    let data = sse_data(&r.text().await.unwrap());
    let text: String = data[..data.len() - 1]
        .iter()
        .map(|d| {
            serde_json::from_str::<serde_json::Value>(d).unwrap()["choices"][0]["text"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(text, whole["choices"][0]["text"].as_str().unwrap());
}

/// A sampling field of the wrong type is refused naming the field, on every route.
#[tokio::test]
async fn wrong_typed_sampling_fields_are_named() {
    let srv = crate::start(|_| {}).await;
    let cases = [
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": "5"}),
            "max_tokens",
        ),
        ("/v1/completions", json!({"prompt": "hi", "temperature": "hot"}), "temperature"),
        (
            "/inference/v1/generate",
            json!({"token_ids": [1, 2], "sampling_params": {"stop_token_ids": ["x"]}}),
            "stop_token_ids",
        ),
    ];
    for (path, body, field) in cases {
        let (s, v) = srv.post(path, body).await;
        assert_eq!(s, 400, "{path}: {v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(field), "{path}: {message:?} should name {field:?}");
    }
}

/// `continue_final_message` (vLLM, transformers) leaves the final message open: the prompt ends
/// with its content, no end-of-turn and no new assistant header, so the reply continues it.
#[tokio::test]
async fn continue_final_message_prefills_the_reply() {
    let srv = start(|_| {}).await;
    let messages = json!([{"role": "user", "content": "abc"}, {"role": "assistant", "content": "The answer is"}]);
    for extra in [
        json!({"continue_final_message": true}),
        json!({"continue_final_message": true, "add_generation_prompt": false}),
    ] {
        let mut body = json!({"messages": messages, "max_tokens": 4, "temperature": 0.0, "return_token_ids": true});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (s, v) = srv.post("/v1/chat/completions", body).await;
        assert_eq!(s, 200, "{v}");
        let (_, text) = srv.post("/detokenize", json!({"tokens": v["prompt_token_ids"]})).await;
        let prompt = text["prompt"].as_str().unwrap();
        assert!(prompt.ends_with("<|im_start|>assistant\nThe answer is"), "{prompt:?}");
        assert_eq!(prompt.matches("<|im_start|>assistant").count(), 1, "{prompt:?}");
    }
    for (body, named) in [
        (json!({"messages": messages, "continue_final_message": true, "add_generation_prompt": true}), "cannot both"),
        (
            json!({"messages": [{"role": "user", "content": "abc"}, {"role": "assistant", "content": " "}],
                "continue_final_message": true}),
            "with content",
        ),
    ] {
        let (s, v) = srv.post("/v1/chat/completions", body.clone()).await;
        assert_eq!(s, 400, "{body}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(named), "{v}");
    }
}

/// `/tokenize` renders chats as the chat route does, template variables and an open final
/// message included: its tokens are the prompt the chat route answers.
#[tokio::test]
async fn tokenize_gives_the_chat_routes_prompt() {
    // A template that reads a variable, as Qwen3's reads `enable_thinking`.
    let srv = start(|c| {
        let path = c.model.path.as_ref().unwrap().join("tokenizer_config.json");
        let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let template = config["chat_template"].as_str().unwrap();
        config["chat_template"] = json!(format!(
            "{{% if enable_thinking is defined and not enable_thinking %}}/no_think {{% endif %}}{template}"
        ));
        std::fs::write(&path, config.to_string()).unwrap();
    })
    .await;
    let user = json!([{"role": "user", "content": "abc"}]);
    let prefilled = json!([{"role": "user", "content": "abc"}, {"role": "assistant", "content": "So"}]);
    for extra in [
        json!({"messages": user}),
        json!({"messages": user, "chat_template_kwargs": {"enable_thinking": false}}),
        json!({"messages": prefilled, "continue_final_message": true, "add_generation_prompt": false}),
    ] {
        let (_, t) = srv.post("/tokenize", extra.clone()).await;
        let mut body = extra.clone();
        body["max_tokens"] = json!(1);
        body["return_token_ids"] = json!(true);
        let (s, v) = srv.post("/v1/chat/completions", body).await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(t["tokens"], v["prompt_token_ids"], "{extra}");
    }
    let (_, plain) = srv.post("/tokenize", json!({"messages": user})).await;
    let (_, no_think) =
        srv.post("/tokenize", json!({"messages": user, "chat_template_kwargs": {"enable_thinking": false}})).await;
    assert_ne!(plain["tokens"], no_think["tokens"], "the template variable reaches the template");
}

/// OpenAI's `developer` role is the system message chat templates know; a role no template knows
/// is refused naming the ones that are.
#[tokio::test]
async fn the_developer_role_is_a_system_message() {
    let srv = start(|_| {}).await;
    let chat =
        |role: &str| json!({"messages": [{"role": role, "content": "Be brief."}, {"role": "user", "content": "abc"}]});
    let (_, system) = srv.post("/tokenize", chat("system")).await;
    let (_, developer) = srv.post("/tokenize", chat("developer")).await;
    assert!(system["tokens"].as_array().is_some_and(|t| !t.is_empty()), "{system}");
    assert_eq!(system["tokens"], developer["tokens"]);
    let (s, v) = srv.post("/v1/chat/completions", chat("narrator")).await;
    assert_eq!(s, 400, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("expected system, developer, user"), "{v}");
}

/// An assistant message's reasoning given apart (`reasoning_content`, or vLLM's newer
/// `reasoning`) reaches the chat template, as Qwen3's renders it.
#[tokio::test]
async fn reasoning_given_apart_reaches_the_template() {
    let srv = start(|c| {
        let path = c.model.path.as_ref().unwrap().join("tokenizer_config.json");
        let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        config["chat_template"] = json!(
            "{% for m in messages %}{% if m.reasoning_content is string %}<think>{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}\n{% endfor %}"
        );
        std::fs::write(&path, config.to_string()).unwrap();
    })
    .await;
    for key in ["reasoning_content", "reasoning"] {
        let messages = json!([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", key: "why"}]);
        let (_, t) = srv.post("/tokenize", json!({"messages": messages, "add_generation_prompt": false})).await;
        let (_, text) = srv.post("/detokenize", json!({"tokens": t["tokens"]})).await;
        assert_eq!(text["prompt"], "q\n<think>why</think>a\n", "{key}");
    }
}

/// The model's generation_config.json fills the sampling fields a request leaves out, as vLLM's
/// default `--generation-config auto` does (here `top_k = 1`: greedy at any temperature, and
/// `max_new_tokens = 3`); a request's own fields win, and `generation_config = "vllm"` ignores it.
#[tokio::test]
async fn the_models_generation_config_fills_unset_sampling_fields() {
    let with_defaults = |source| {
        move |c: &mut rl_configs::InferenceConfig| {
            let path = c.model.path.as_ref().unwrap().join("generation_config.json");
            let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            config["top_k"] = json!(1);
            config["max_new_tokens"] = json!(3);
            std::fs::write(&path, config.to_string()).unwrap();
            c.generation_config = source;
        }
    };
    let tokens = |v: &serde_json::Value| v["choices"][0]["token_ids"].as_array().unwrap().clone();
    let chat = |extra: serde_json::Value, seed: u64| {
        let mut body = json!({"messages": [{"role": "user", "content": "tell me"}], "temperature": 1.0,
                              "seed": seed, "return_token_ids": true, "ignore_eos": true});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        body
    };
    let auto = start(with_defaults(None)).await;
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..4 {
        let (s, v) = auto.post("/v1/chat/completions", chat(json!({}), seed)).await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(tokens(&v).len(), 3, "max_new_tokens is the default max_tokens: {v}");
        seen.insert(tokens(&v).iter().map(|t| t.as_u64().unwrap()).collect::<Vec<_>>());
    }
    assert_eq!(seen.len(), 1, "top_k = 1 samples the argmax whatever the seed: {seen:?}");
    let own = varied(&auto, &chat, json!({"top_k": -1, "max_tokens": 8})).await;
    assert!(own.len() > 1 && own.iter().all(|t| t.len() == 8), "the request's own fields win: {own:?}");
    let neutral = start(with_defaults(Some(rl_configs::GenerationConfigSource::Vllm))).await;
    let plain = varied(&neutral, &chat, json!({"max_tokens": 8})).await;
    assert!(plain.len() > 1, "`vllm`: no top_k from the model's file: {plain:?}");
}

/// The distinct token sequences of six seeds of `chat(extra, seed)`.
async fn varied(
    srv: &crate::Srv,
    chat: &impl Fn(serde_json::Value, u64) -> serde_json::Value,
    extra: serde_json::Value,
) -> std::collections::BTreeSet<Vec<u64>> {
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..6 {
        let (s, v) = srv.post("/v1/chat/completions", chat(extra.clone(), seed)).await;
        assert_eq!(s, 200, "{v}");
        seen.insert(v["choices"][0]["token_ids"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect());
    }
    seen
}
