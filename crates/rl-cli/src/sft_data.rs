//! SFT data from dataset rows (JSONL, JSON, Parquet, CSV or Arrow files, Hugging Face dataset directories;
//! read by `rl-data`): `{"messages": [...]}` rows (tool calls kept) or prompt/completion rows
//! (`{"prompt": ..., "completion": ...}`, each a string or a message list; only the completion is
//! trained), with their tools as prime-rl takes them. Errors name the file, the row and the field.

use std::path::Path;

use anyhow::{Context, bail};
use rl_model::{TemplateFunction, TemplateMessage, TemplateToolCall};
use serde_json::Value;

/// One training conversation: its messages, the first one that may be trained, and the tools the
/// chat template renders into the prompt (OpenAI's schema, as TRL's SFT takes them).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SftConversation {
    pub(crate) messages: Vec<TemplateMessage>,
    pub(crate) first_trained: usize,
    pub(crate) tools: Vec<Value>,
}

/// Every row of a data file (JSONL, JSON, Parquet, CSV or Arrow).
pub(crate) fn read_file(path: &Path) -> anyhow::Result<Vec<SftConversation>> {
    conversations(rl_data::read_file(path)?)
}

/// Dataset rows as conversations; an error names the row.
pub(crate) fn conversations(rows: Vec<rl_data::Row>) -> anyhow::Result<Vec<SftConversation>> {
    rows.into_iter().map(|row| conversation(&Value::Object(row.fields)).with_context(|| row.at.clone())).collect()
}

/// One row as a conversation.
pub(crate) fn conversation(row: &Value) -> anyhow::Result<SftConversation> {
    let tools = match (row.get("tools"), row.get("tool_defs")) {
        (Some(t), _) if !t.is_null() => tools(t, "tools")?,
        (_, Some(t)) => tools(t, "tool_defs")?,
        _ => Vec::new(),
    };
    if let Some(messages) = row.get("messages") {
        return Ok(SftConversation { messages: message_list(messages, "messages")?, first_trained: 0, tools });
    }
    match (row.get("prompt"), row.get("completion")) {
        (Some(prompt), Some(completion)) => {
            let mut messages = turns(prompt, "prompt", "user")?;
            let first_trained = messages.len();
            messages.extend(turns(completion, "completion", "assistant")?);
            Ok(SftConversation { messages, first_trained, tools })
        }
        _ => bail!("expected {{\"messages\": [...]}} or {{\"prompt\": ..., \"completion\": ...}}"),
    }
}

/// A row's tools, handed to the chat template as OpenAI function tools (`{"type": "function",
/// "function": {"name": ..., "description": ..., "parameters": {...}}}`). As prime-rl reads them:
/// the list or its JSON text (how a Parquet column of varied schemas holds it), under `tools`, or
/// under `tool_defs` as verifiers writes them (`{"name", "description", "parameters"}`, wrapped).
fn tools(v: &Value, key: &str) -> anyhow::Result<Vec<Value>> {
    let parsed;
    let items = match v {
        Value::Null => return Ok(Vec::new()),
        Value::Array(items) => items,
        Value::String(text) => match serde_json::from_str::<Value>(text) {
            Ok(Value::Array(items)) => {
                parsed = items;
                &parsed
            }
            _ => bail!("`{key}` must be a list of tools, or its JSON text"),
        },
        _ => bail!("`{key}` must be a list of tools, or its JSON text"),
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, t) in items.iter().enumerate() {
        // A verifiers tool definition: the function itself, not yet wrapped.
        let t = match t.get("name") {
            Some(_) if t.get("function").is_none() => serde_json::json!({"type": "function", "function": t}),
            _ => t.clone(),
        };
        if t.get("type").and_then(Value::as_str).is_some_and(|k| k != "function") {
            bail!("`{key}[{i}].type` must be \"function\", got {}", t["type"]);
        }
        let function = t.get("function").filter(|f| f.is_object());
        let function = function.with_context(|| format!("`{key}[{i}].function` must be an object"))?;
        if !function.get("name").is_some_and(Value::is_string) {
            bail!("`{key}[{i}].function.name` must be a string");
        }
        out.push(t);
    }
    Ok(out)
}

/// A string (one message of `role`) or a message list.
fn turns(v: &Value, field: &str, role: &str) -> anyhow::Result<Vec<TemplateMessage>> {
    match v {
        Value::String(text) => Ok(vec![TemplateMessage {
            role: role.to_owned(),
            content: text.clone(),
            tool_calls: vec![],
            reasoning_content: None,
        }]),
        _ => message_list(v, field),
    }
}

fn message_list(v: &Value, field: &str) -> anyhow::Result<Vec<TemplateMessage>> {
    let items = v.as_array().with_context(|| format!("`{field}` must be a list of messages"))?;
    items.iter().enumerate().map(|(i, m)| message(m, &format!("{field}[{i}]"))).collect()
}

fn message(m: &Value, field: &str) -> anyhow::Result<TemplateMessage> {
    let role = m.get("role").and_then(Value::as_str).with_context(|| format!("`{field}.role` is missing"))?;
    // OpenAI's newer name for system instructions, as the inference server takes it.
    let role = if role == "developer" { "system" } else { role };
    if !["system", "user", "assistant", "tool"].contains(&role) {
        bail!("`{field}.role` must be system (or developer), user, assistant or tool, got {role:?}");
    }
    let content = match m.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => bail!("`{field}.content` must be a string"),
    };
    let tool_calls = match m.get("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(calls)) => calls
            .iter()
            .enumerate()
            .map(|(j, c)| {
                let f = c.get("function").with_context(|| format!("`{field}.tool_calls[{j}].function` is missing"))?;
                let name = f.get("name").and_then(Value::as_str);
                let name = name.with_context(|| format!("`{field}.tool_calls[{j}].function.name` is missing"))?;
                let arguments = match f.get("arguments") {
                    Some(Value::String(s)) => s.clone(),
                    Some(other) => other.to_string(),
                    None => String::from("{}"),
                };
                Ok(TemplateToolCall {
                    kind: String::from("function"),
                    function: TemplateFunction { name: name.to_owned(), arguments },
                })
            })
            .collect::<anyhow::Result<_>>()?,
        Some(_) => bail!("`{field}.tool_calls` must be a list"),
    };
    let reasoning_content = match m.get("reasoning_content") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => bail!("`{field}.reasoning_content` must be a string"),
    };
    Ok(TemplateMessage { role: role.to_owned(), content, tool_calls, reasoning_content })
}

/// An env message as the chat template takes it (tool calls included).
pub(crate) fn template_message(m: &rl_serve::Message) -> TemplateMessage {
    TemplateMessage {
        role: m.role.as_str().to_owned(),
        content: m.content.clone(),
        tool_calls: m
            .tool_calls
            .iter()
            .map(|c| TemplateToolCall {
                kind: String::from("function"),
                function: TemplateFunction { name: c.name.clone(), arguments: c.arguments.clone() },
            })
            .collect(),
        reasoning_content: None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn messages_keep_their_tool_calls() {
        let row = json!({"messages": [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "4"},
            {"role": "assistant", "content": "4", "reasoning_content": "the tool said 4"}]});
        let c = conversation(&row).unwrap();
        assert_eq!(c.first_trained, 0);
        assert_eq!(c.messages.len(), 4);
        let call = &c.messages[1].tool_calls[0];
        assert_eq!((call.function.name.as_str(), call.function.arguments.as_str()), ("add", r#"{"a":2,"b":2}"#));
        assert_eq!(c.messages[3].reasoning_content.as_deref(), Some("the tool said 4"));
        let bad = json!({"messages": [{"role": "assistant", "content": "4", "reasoning_content": 1}]});
        assert!(conversation(&bad).unwrap_err().to_string().contains("reasoning_content"));
    }

    #[test]
    fn prompt_completion_rows_train_only_the_completion() {
        let plain = conversation(&json!({"prompt": "2+2?", "completion": "4"})).unwrap();
        let roles: Vec<&str> = plain.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!((roles, plain.first_trained), (vec!["user", "assistant"], 1));
        let chat = json!({
            "prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "1+1?"},
                       {"role": "assistant", "content": "2"}, {"role": "user", "content": "2+2?"}],
            "completion": [{"role": "assistant", "content": "4"}]});
        assert_eq!(conversation(&chat).unwrap().first_trained, 4, "the prompt's assistant turn is context");
    }

    /// A row's tools are rendered into the prompt by the chat template, as the RL env's prompt of
    /// the same conversation is (and the trained reply is the same tokens); bad tools are named.
    #[test]
    fn tools_of_a_row_are_rendered_by_the_chat_template_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        rl_model::init_model(dir.path(), rl_model::Preset::Tiny, 0, false).unwrap();
        let (tok, template) =
            (rl_model::Tok::load(dir.path()).unwrap(), rl_model::ChatTemplate::load(dir.path()).unwrap());
        let tool = json!({"type": "function", "function": {"name": "lookup", "description": "Finds a page.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}});
        let row = json!({"tools": [tool], "prompt": "find x", "completion": "ok"});
        let c = conversation(&row).unwrap();
        assert_eq!(c.tools, vec![tool]);
        let mask = rl_configs::LossMaskConfig::default();
        let with = rl_trainer::tokenize(&tok, &template, &c.messages, &c.tools, c.first_trained, &mask).unwrap();
        let without = rl_trainer::tokenize(&tok, &template, &c.messages, &[], c.first_trained, &mask).unwrap();
        let rendered = template.render(&c.messages, &c.tools, false).unwrap();
        assert!(rendered.contains("lookup") && rendered.contains("Finds a page."), "{rendered}");
        assert_eq!(with.ids, tok.encode(&rendered).unwrap(), "the prompt is the template's rendering with tools");
        assert!(with.ids.len() > without.ids.len());
        let trained = |e: &rl_trainer::SftExample| -> Vec<u32> {
            e.ids.iter().zip(&e.mask).filter(|(_, m)| **m).map(|(i, _)| *i).collect()
        };
        assert_eq!(trained(&with), trained(&without), "the same reply is trained");
        for (bad, says) in [
            (json!("lookup"), "`tools` must be a list of tools, or its JSON text"),
            (json!([{"type": "function"}]), "`tools[0].function`"),
            (json!([{"type": "function", "function": {"description": "x"}}]), "`tools[0].function.name`"),
            (json!([{"type": "retrieval", "function": {"name": "x"}}]), "`tools[0].type`"),
        ] {
            let err = conversation(&json!({"tools": bad, "prompt": "a", "completion": "b"})).unwrap_err().to_string();
            assert!(err.contains(says), "{err}");
        }
    }

    /// Tools as prime-rl reads them: a list, its JSON text (a Parquet column of varied tool
    /// schemas is text), or verifiers' unwrapped `tool_defs`.
    #[test]
    fn tools_may_be_json_text_or_verifiers_tool_defs() {
        let f = json!({"name": "lookup", "description": "Finds a page.", "parameters": {"type": "object"}});
        let wrapped = json!({"type": "function", "function": f});
        let as_text =
            json!({"tools": serde_json::to_string(&json!([wrapped])).unwrap(), "prompt": "a", "completion": "b"});
        assert_eq!(conversation(&as_text).unwrap().tools, vec![wrapped.clone()]);
        let defs = json!({"tool_defs": [f], "prompt": "a", "completion": "b"});
        assert_eq!(conversation(&defs).unwrap().tools, vec![wrapped.clone()]);
        let null_tools = json!({"tools": null, "tool_defs": serde_json::to_string(&json!([f])).unwrap(), "prompt": "a", "completion": "b"});
        assert_eq!(conversation(&null_tools).unwrap().tools, vec![wrapped]);
        let err = conversation(&json!({"tool_defs": [{"name": 3}], "prompt": "a", "completion": "b"})).unwrap_err();
        assert!(err.to_string().contains("`tool_defs[0].function.name` must be a string"), "{err}");
    }

    /// Rows of a Parquet file pyarrow wrote (nested messages, a tool call with null content, tools
    /// as JSON text) become conversations; a bad row is named by file and row.
    #[test]
    fn parquet_rows_become_conversations() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../rl-data/tests/fixtures/data");
        let chats = read_file(&fixtures.join("train-00000-of-00001.parquet")).unwrap();
        assert_eq!(chats.len(), 3);
        let roles: Vec<&str> = chats[1].messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "assistant"]);
        assert_eq!(chats[1].messages[2].tool_calls[0].function.arguments, r#"{"word": "ütf"}"#);
        assert_eq!(chats[1].tools[0]["function"]["name"], "lookup");
        let pc = read_file(&fixtures.join("test-00000-of-00001.parquet")).unwrap();
        assert_eq!((pc[0].first_trained, pc[0].messages[1].content.as_str()), (1, "4"));
        let bad = rl_data::Row {
            fields: json!({"text": "x"}).as_object().unwrap().clone(),
            at: String::from("f.parquet row 7"),
        };
        let err = conversations(vec![bad]).unwrap_err();
        assert!(format!("{err:#}").starts_with("f.parquet row 7: expected"), "{err:#}");
    }

    #[test]
    fn the_prompt_of_a_prompt_completion_row_is_never_trained() {
        let dir = tempfile::tempdir().unwrap();
        rl_model::init_model(dir.path(), rl_model::Preset::Tiny, 0, false).unwrap();
        let (tok, template) =
            (rl_model::Tok::load(dir.path()).unwrap(), rl_model::ChatTemplate::load(dir.path()).unwrap());
        let row = json!({"prompt": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                                    {"role": "user", "content": "2+2?"}], "completion": "4"});
        let c = conversation(&row).unwrap();
        let mask = rl_configs::LossMaskConfig::default();
        let as_prompt = rl_trainer::tokenize(&tok, &template, &c.messages, &c.tools, c.first_trained, &mask).unwrap();
        let as_messages = rl_trainer::tokenize(&tok, &template, &c.messages, &c.tools, 0, &mask).unwrap();
        let trained = |m: &[bool]| m.iter().filter(|t| **t).count();
        // "4" plus the end-of-turn token (char-level tokenizer); as plain messages "yo" is trained too.
        assert_eq!(trained(&as_prompt.mask), 2);
        assert_eq!(trained(&as_messages.mask), 5, "\"yo\" + its end-of-turn token as well");
        assert!(as_prompt.mask[..as_prompt.mask.len() - 3].iter().all(|t| !t));
    }

    #[test]
    fn bad_rows_name_the_field() {
        let err = |row: Value| format!("{:#}", conversation(&row).unwrap_err());
        assert!(err(json!({"text": "x"})).contains("expected {\"messages\""));
        assert!(err(json!({"messages": [{"content": "x"}]})).contains("`messages[0].role` is missing"));
        assert!(err(json!({"prompt": "p", "completion": [{"role": "bot"}]})).contains("`completion[0].role` must be"));
        assert!(
            err(json!({"messages": [{"role": "assistant", "tool_calls": [{}]}]})).contains("tool_calls[0].function")
        );
    }
}
