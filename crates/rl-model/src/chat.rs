//! Chat formatting: renders the Jinja `chat_template` of `tokenizer_config.json` (minijinja with
//! Python-compatible string methods), with tools and the generation prompt.

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
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TemplateMessage {
    /// Role.
    pub role: String,
    /// Text.
    pub content: String,
    /// Tool calls (assistant).
    #[serde(default)]
    pub tool_calls: Vec<TemplateToolCall>,
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
}

impl ChatTemplate {
    /// Compiles a template source.
    pub fn new(source: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> std::result::Result<String, minijinja::Error> {
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
        });
        env.add_template_owned("chat", source.to_owned()).map_err(|e| Error::Template(e.to_string()))?;
        Ok(ChatTemplate { env })
    }

    /// Loads `chat_template` from a model directory's `tokenizer_config.json`.
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("tokenizer_config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| Error::Template(format!("{}: {e}", path.display())))?;
        let source = v["chat_template"]
            .as_str()
            .ok_or_else(|| Error::Template(format!("{} has no chat_template", path.display())))?;
        ChatTemplate::new(source)
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
    /// `enable_thinking`), as HF `apply_chat_template(**kwargs)` passes them. They may not replace
    /// the variables the renderer sets.
    pub fn render_with(
        &self,
        messages: &[TemplateMessage],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        const SET_HERE: [&str; 5] = ["messages", "tools", "add_generation_prompt", "bos_token", "eos_token"];
        if let Some(k) = kwargs.keys().find(|k| SET_HERE.contains(&k.as_str())) {
            return Err(Error::Input(format!("chat_template_kwargs may not set `{k}`")));
        }
        let tmpl = self.env.get_template("chat").map_err(|e| Error::Template(e.to_string()))?;
        let tools = if tools.is_empty() { Value::from(()) } else { Value::from(Serde(tools)) };
        tmpl.render(context! {
            messages => Value::from(Serde(messages)),
            tools => tools,
            add_generation_prompt => add_generation_prompt,
            bos_token => "",
            eos_token => "<|im_end|>",
            ..Value::from(Serde(kwargs))
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
        let msgs = [TemplateMessage { role: String::from("user"), content: String::from("hi"), tool_calls: vec![] }];
        assert_eq!(t.render(&msgs, &[], true).unwrap(), "hi");
        let off = serde_json::json!({"enable_thinking": false});
        assert_eq!(t.render_with(&msgs, &[], true, off.as_object().unwrap()).unwrap(), "/no_think hi");
        let bad = serde_json::json!({"messages": []});
        assert!(
            t.render_with(&msgs, &[], true, bad.as_object().unwrap()).unwrap_err().to_string().contains("messages")
        );
    }
}
