//! Chat-template fidelity against transformers: every case of `tests/fixtures/chat/cases.json`
//! (written by `scripts/check_chat_templates.py` from `apply_chat_template`) renders to the same
//! text and the same token ids with `rl-model`'s template and byte-level BPE tokenizer.

use std::path::PathBuf;

use rl_model::{ChatTemplate, TemplateFunction, TemplateMessage, TemplateToolCall, Tok};
use serde_json::Value;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat")
}

/// An OpenAI-shaped message as the renderer takes it.
fn message(m: &Value) -> TemplateMessage {
    let calls = m["tool_calls"].as_array().map(Vec::as_slice).unwrap_or_default();
    TemplateMessage {
        role: m["role"].as_str().unwrap().to_owned(),
        content: m["content"].as_str().unwrap().to_owned(),
        tool_calls: calls
            .iter()
            .map(|c| TemplateToolCall {
                kind: String::from("function"),
                function: TemplateFunction {
                    name: c["function"]["name"].as_str().unwrap().to_owned(),
                    arguments: c["function"]["arguments"].as_str().unwrap().to_owned(),
                },
            })
            .collect(),
        reasoning_content: None,
    }
}

#[test]
fn chat_templates_render_and_tokenize_as_transformers_does() {
    let text = std::fs::read_to_string(fixtures().join("cases.json")).unwrap();
    let cases: Vec<Value> = serde_json::from_str(&text).unwrap();
    assert!(cases.len() >= 9, "{} cases", cases.len());
    for case in &cases {
        let dir = fixtures().join(case["dir"].as_str().unwrap());
        let name = format!("{} / {}", case["dir"].as_str().unwrap(), case["case"].as_str().unwrap());
        let (template, tok) = (ChatTemplate::load(&dir).unwrap(), Tok::load(&dir).unwrap());
        let messages: Vec<TemplateMessage> = case["messages"].as_array().unwrap().iter().map(message).collect();
        let tools = case["tools"].as_array().cloned().unwrap_or_default();
        let kwargs = case["chat_template_kwargs"].as_object().unwrap();
        let generation = case["add_generation_prompt"].as_bool().unwrap();
        let ours =
            template.render_with(&messages, &tools, generation, kwargs).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(ours, case["text"].as_str().unwrap(), "{name}: rendered text");
        let ids = tok.encode(&ours).unwrap();
        let want: Vec<u32> = case["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        assert_eq!(ids, want, "{name}: token ids");
        // Read by scripts/check_chat_templates.py (run with --nocapture).
        #[allow(clippy::print_stdout)]
        {
            println!("{name}: identical text and {} token ids", ids.len());
        }
    }
}
