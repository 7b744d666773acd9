//! Chat formatting: renders a model's Jinja chat template (`chat_template.jinja`, or
//! `chat_template` in `tokenizer_config.json`, one source or named ones) as transformers'
//! `apply_chat_template` does: minijinja with `trim_blocks` and `lstrip_blocks`, Python string
//! methods, HF's `tojson`, `raise_exception` and `strftime_now`, and the tokenizer's special
//! tokens (`bos_token`, `eos_token`, ...) as variables.

mod python;

use std::path::Path;

use minijinja::value::Serde;
use minijinja::{Environment, Value, context};
use serde::Serialize;

use crate::error::{Error, Result};

/// A Qwen-style template: `<|im_start|>role\ncontent<|im_end|>\n`, tools in the system turn, tool
/// calls as `<tool_call>{...}</tool_call>`, tool results as user turns in `<tool_response>`.
/// Contents are rendered verbatim so a conversation's prompt extends the previous prompt plus the
/// model's completion token for token.
pub const QWEN_TEMPLATE: &str = r#"{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}{% for message in messages %}{% if message.role == 'system' and loop.first %}{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% elif message.role == 'assistant' %}<|im_start|>assistant
{{ message.content }}{% for call in message.tool_calls %}<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments }}}
</tool_call>{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"#;

/// A tool call inside an assistant message (OpenAI shape).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TemplateToolCall {
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The call.
    pub function: TemplateFunction,
}

/// The function part of a tool call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TemplateFunction {
    /// Tool name.
    pub name: String,
    /// Arguments, JSON text.
    pub arguments: String,
}

/// One message as the template sees it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TemplateMessage {
    /// Role.
    pub role: String,
    /// Text.
    pub content: String,
    /// Tool calls (assistant). Absent from the message when empty, as in an HF message dict
    /// (templates test `'tool_calls' in message`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<TemplateToolCall>,
    /// An assistant's reasoning given apart from its content (vLLM's reasoning parsers return it
    /// so; Qwen3's template renders `message.reasoning_content` in `<think>` for the turns after
    /// the last user query). Absent when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

/// Special-token keys of `tokenizer_config.json` that transformers passes to the template.
const SPECIAL_TOKEN_KEYS: [&str; 8] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
    "additional_special_tokens",
];

/// A compiled chat template (one source, or named ones such as `default` and `tool_use`).
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    /// The tokenizer's special tokens, as template variables.
    specials: serde_json::Map<String, serde_json::Value>,
}

impl ChatTemplate {
    /// Compiles a template source (no special tokens defined).
    pub fn new(source: &str) -> Result<Self> {
        Self::named(&[(String::from("default"), source.to_owned())], serde_json::Map::new())
    }

    /// Compiles named templates with the tokenizer's special tokens.
    fn named(sources: &[(String, String)], specials: serde_json::Map<String, serde_json::Value>) -> Result<Self> {
        let mut env = Environment::new();
        // transformers: ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| Error::Template(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", python::tojson);
        env.add_function("raise_exception", |msg: String| -> std::result::Result<String, minijinja::Error> {
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", |format: String| python::strftime_now(&format));
        for (name, source) in sources {
            env.add_template_owned(name.clone(), source.clone())
                .map_err(|e| Error::Template(format!("template {name:?}: {e}")))?;
        }
        Ok(ChatTemplate { env, specials })
    }

    /// Loads a model directory's chat template as transformers does: `chat_template.jinja` if
    /// present, else `chat_template` of `tokenizer_config.json` (a string, or a list of
    /// `{"name", "template"}`); special tokens from `tokenizer_config.json`.
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("tokenizer_config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| Error::Template(format!("{}: {e}", path.display())))?;
        let jinja = dir.join("chat_template.jinja");
        let sources: Vec<(String, String)> = if jinja.is_file() {
            let source = std::fs::read_to_string(&jinja).map_err(|e| Error::io(&jinja, e))?;
            vec![(String::from("default"), source)]
        } else {
            match &v["chat_template"] {
                serde_json::Value::String(s) => vec![(String::from("default"), s.clone())],
                serde_json::Value::Array(list) => list
                    .iter()
                    .map(|t| match (t["name"].as_str(), t["template"].as_str()) {
                        (Some(n), Some(s)) => Ok((n.to_owned(), s.to_owned())),
                        _ => Err(Error::Template(format!(
                            "{}: chat_template list entries need a \"name\" and a \"template\" string",
                            path.display()
                        ))),
                    })
                    .collect::<Result<_>>()?,
                _ => {
                    return Err(Error::Template(format!(
                        "{} has no chat_template (and there is no chat_template.jinja)",
                        path.display()
                    )));
                }
            }
        };
        let mut specials = serde_json::Map::new();
        for key in SPECIAL_TOKEN_KEYS {
            let token = match &v[key] {
                serde_json::Value::Object(o) => o.get("content").cloned().unwrap_or_default(),
                serde_json::Value::Array(list) => serde_json::Value::Array(
                    list.iter().map(|t| t.get("content").cloned().unwrap_or_else(|| t.clone())).collect(),
                ),
                other => other.clone(),
            };
            if !token.is_null() {
                specials.insert(key.to_owned(), token);
            }
        }
        Self::named(&sources, specials)
    }

    /// Renders `messages` (and `tools`, JSON schemas in OpenAI form) to the prompt text.
    pub fn render(
        &self,
        messages: &[TemplateMessage],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.render_with(messages, tools, add_generation_prompt, &serde_json::Map::new())
    }

    /// [`ChatTemplate::render`] with extra template variables (`chat_template_kwargs`, e.g.
    /// `enable_thinking`), as HF `apply_chat_template(**kwargs)` passes them: they override the
    /// special tokens but may not replace `messages`, `tools` or `add_generation_prompt`. With
    /// tools, a template named `tool_use` is used if there is one, else `default`.
    pub fn render_with(
        &self,
        messages: &[TemplateMessage],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        const SET_HERE: [&str; 3] = ["messages", "tools", "add_generation_prompt"];
        if let Some(k) = kwargs.keys().find(|k| SET_HERE.contains(&k.as_str())) {
            return Err(Error::Input(format!("chat_template_kwargs may not set `{k}`")));
        }
        let name = if !tools.is_empty() && self.env.get_template("tool_use").is_ok() { "tool_use" } else { "default" };
        let tmpl = self.env.get_template(name).map_err(|e| Error::Template(e.to_string()))?;
        let tools = if tools.is_empty() { Value::from(()) } else { Value::from(Serde(tools)) };
        let mut vars = self.specials.clone();
        vars.extend(kwargs.iter().map(|(k, v)| (k.clone(), v.clone())));
        tmpl.render(context! {
            messages => Value::from(Serde(messages)),
            tools => tools,
            add_generation_prompt => add_generation_prompt,
            ..Value::from(Serde(vars))
        })
        .map_err(|e| Error::Template(e.to_string()))
    }
}

/// Writes `tokenizer_config.json` with the Qwen template and the special tokens.
pub fn write_tokenizer_config(path: &Path, specials: &[&str]) -> Result<()> {
    let added: serde_json::Map<String, serde_json::Value> = specials
        .iter()
        .enumerate()
        .map(|(i, t)| {
            (
                i.to_string(),
                serde_json::json!({"content": t, "lstrip": false, "normalized": false, "rstrip": false, "single_word": false, "special": true}),
            )
        })
        .collect();
    let v = serde_json::json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": QWEN_TEMPLATE,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": "<unk>",
        "bos_token": null,
        "model_max_length": 2048,
        "clean_up_tokenization_spaces": false,
        "added_tokens_decoder": added,
    });
    std::fs::write(path, serde_json::to_string_pretty(&v).expect("json")).map_err(|e| Error::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_template_kwargs_reach_the_template_but_cannot_replace_its_variables() {
        let t = ChatTemplate::new(
            "{% if enable_thinking is defined and not enable_thinking %}/no_think {% endif %}\
             {% for m in messages %}{{ m.content }}{% endfor %}",
        )
        .unwrap();
        let msgs = [TemplateMessage {
            role: String::from("user"),
            content: String::from("hi"),
            tool_calls: vec![],
            reasoning_content: None,
        }];
        assert_eq!(t.render(&msgs, &[], true).unwrap(), "hi");
        let off = serde_json::json!({"enable_thinking": false});
        assert_eq!(t.render_with(&msgs, &[], true, off.as_object().unwrap()).unwrap(), "/no_think hi");
        let bad = serde_json::json!({"messages": []});
        assert!(
            t.render_with(&msgs, &[], true, bad.as_object().unwrap()).unwrap_err().to_string().contains("messages")
        );
    }

    #[test]
    fn reasoning_given_apart_reaches_the_template_as_qwen3_reads_it() {
        // Qwen3's test: `message.reasoning_content is string`, else the reasoning inside content.
        let t = ChatTemplate::new(
            "{% for m in messages %}{% if m.reasoning_content is string %}<think>{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}|{% endfor %}",
        )
        .unwrap();
        let reply = |reasoning: Option<&str>| TemplateMessage {
            role: String::from("assistant"),
            content: String::from("4"),
            reasoning_content: reasoning.map(str::to_owned),
            ..Default::default()
        };
        assert_eq!(t.render(&[reply(Some("2 + 2"))], &[], false).unwrap(), "<think>2 + 2</think>4|");
        assert_eq!(t.render(&[reply(None)], &[], false).unwrap(), "4|");
    }
}
