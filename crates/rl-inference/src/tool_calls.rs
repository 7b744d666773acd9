//! What a request's `tool_choice` asks for, and tool-call parsing of completions. `hermes`
//! (Qwen's format) reads `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks; the
//! arguments keep their exact text, so re-rendering the assistant message reproduces the tokens
//! the model sampled.

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use rl_model::{ChatTemplate, TemplateFunction, TemplateMessage, TemplateToolCall};

use crate::error::{Error, Result};

/// A parsed call: (name, arguments as JSON text).
pub(crate) type ParsedCall = (String, String);

#[derive(Deserialize)]
struct RawCall<'a> {
    name: String,
    #[serde(borrow)]
    arguments: Option<&'a RawValue>,
}

/// How a model writes tool calls (vLLM's `--tool-call-parser` names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CallFormat {
    /// `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` blocks (Qwen, Hermes).
    Hermes,
    /// The reply is `{"name": ..., "parameters": {...}}` (Llama 3.1+), calls separated by `;`,
    /// optionally after `<|python_tag|>`.
    Llama3Json,
}

impl CallFormat {
    /// The format `inference.tool_call_parser` names (`None` for `none`); `auto` renders an
    /// assistant's call with the chat template and takes the format it comes out in.
    pub(crate) fn resolve(name: &str, template: &ChatTemplate) -> Option<Self> {
        match name {
            "none" => None,
            "llama3_json" => Some(CallFormat::Llama3Json),
            "auto" => Some(Self::rendered_by(template)),
            _ => Some(CallFormat::Hermes),
        }
    }

    fn rendered_by(template: &ChatTemplate) -> Self {
        let call = TemplateToolCall {
            kind: String::from("function"),
            function: TemplateFunction { name: String::from("probe_fn"), arguments: String::from("{\"x\": 1}") },
        };
        let message = |role: &str, content: &str, tool_calls: Vec<TemplateToolCall>| TemplateMessage {
            role: role.to_owned(),
            content: content.to_owned(),
            tool_calls,
            reasoning_content: None,
        };
        let messages = [message("user", "hi", Vec::new()), message("assistant", "", vec![call])];
        let tool =
            serde_json::json!({"type": "function", "function": {"name": "probe_fn", "parameters": {"type": "object"}}});
        let rendered = template.render(&messages, &[tool], false).unwrap_or_default();
        if !rendered.contains("<tool_call>") && rendered.contains(r#""name": "probe_fn", "parameters""#) {
            CallFormat::Llama3Json
        } else {
            // Qwen-style templates, and templates that render no calls (hermes parses only
            // `<tool_call>` blocks, so plain replies stay plain).
            CallFormat::Hermes
        }
    }

    /// Splits a completion into its content and its tool calls (the first only unless `many`:
    /// OpenAI's `parallel_tool_calls = false`).
    pub(crate) fn parse(self, text: &str, many: bool) -> (String, Vec<ParsedCall>) {
        let (content, mut calls) = match self {
            CallFormat::Hermes => parse_hermes(text),
            CallFormat::Llama3Json => parse_llama3_json(text),
        };
        if !many {
            calls.truncate(1);
        }
        (content, calls)
    }
}

#[derive(Deserialize)]
struct LlamaCall<'a> {
    name: String,
    #[serde(borrow, alias = "arguments")]
    parameters: Option<&'a RawValue>,
}

/// A reply that is nothing but calls (`{"name": ..., "parameters": ...}` objects separated by `;`,
/// optionally after `<|python_tag|>`) is those calls with empty content; anything else is content.
fn parse_llama3_json(text: &str) -> (String, Vec<ParsedCall>) {
    let plain = || (text.to_owned(), Vec::new());
    let body = text.trim_start();
    let mut rest = body.strip_prefix("<|python_tag|>").unwrap_or(body).trim();
    if !rest.starts_with('{') {
        return plain();
    }
    let mut calls = Vec::new();
    while !rest.is_empty() {
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<LlamaCall<'_>>();
        let Some(Ok(call)) = values.next() else { return plain() };
        let args = call.parameters.map_or_else(|| String::from("{}"), |a| a.get().to_owned());
        calls.push((call.name, args));
        rest = rest[values.byte_offset()..].trim_start();
        if let Some(next) = rest.strip_prefix(';') {
            rest = next.trim_start();
        } else if !rest.is_empty() {
            return plain();
        }
    }
    (String::new(), calls)
}

/// Splits a completion into its content (the text before the first call) and its tool calls.
/// Text that looks like a call but is not valid JSON stays in the content.
fn parse_hermes(text: &str) -> (String, Vec<ParsedCall>) {
    let Some(first) = text.find("<tool_call>") else { return (text.to_owned(), Vec::new()) };
    let mut calls = Vec::new();
    let mut rest = &text[first..];
    while let Some(start) = rest.find("<tool_call>") {
        let after = &rest[start + "<tool_call>".len()..];
        let Some(end) = after.find("</tool_call>") else { break };
        match serde_json::from_str::<RawCall<'_>>(after[..end].trim()) {
            Ok(c) => calls.push((c.name, c.arguments.map_or_else(|| String::from("{}"), |a| a.get().to_owned()))),
            Err(_) => return (text.to_owned(), Vec::new()),
        }
        rest = &after[end + "</tool_call>".len()..];
    }
    if calls.is_empty() { (text.to_owned(), Vec::new()) } else { (text[..first].to_owned(), calls) }
}

/// What `tool_choice` asks of the reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ToolChoice {
    /// Not parsed for calls (`none`).
    None,
    /// Parsed for calls the model chose to make (`auto`, the default).
    Auto,
    /// One or more calls, constrained to the tools' schemas (`required`).
    Required,
    /// One call of this tool (`{"type": "function", "function": {"name": ...}}`).
    Named(String),
}

/// A request's `tool_choice`, checked against its `tools`.
pub(crate) fn tool_choice(tool_choice: Option<&Value>, tools: &[Value]) -> Result<ToolChoice> {
    let choice = match tool_choice {
        None => ToolChoice::Auto,
        Some(Value::String(s)) if s == "auto" => ToolChoice::Auto,
        Some(Value::String(s)) if s == "none" => ToolChoice::None,
        Some(Value::String(s)) if s == "required" => ToolChoice::Required,
        Some(v) if v.get("type").and_then(Value::as_str) == Some("function") => {
            match v.get("function").and_then(|f| f.get("name")).and_then(Value::as_str) {
                Some(name) => ToolChoice::Named(name.to_owned()),
                None => return Err(Error::BadRequest(format!("tool_choice {v} names no function.name"))),
            }
        }
        Some(other) => {
            return Err(Error::BadRequest(format!(
                "tool_choice {other} is not understood: use \"auto\", \"none\", \"required\" or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"
            )));
        }
    };
    if matches!(choice, ToolChoice::Required | ToolChoice::Named(_)) && tools.is_empty() {
        return Err(Error::BadRequest(String::from("tool_choice requires a call but the request has no tools")));
    }
    if let ToolChoice::Named(name) = &choice
        && !tools.iter().any(|t| tool_name(t) == Some(name.as_str()))
    {
        return Err(Error::BadRequest(format!("tool_choice names {name:?}, which is not among the request's tools")));
    }
    Ok(choice)
}

/// A request tool's `function.name`.
pub(crate) fn tool_name(tool: &Value) -> Option<&str> {
    tool.get("function").and_then(|f| f.get("name")).and_then(Value::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_calls_are_whole_replies_of_json_objects() {
        let (content, calls) =
            parse_llama3_json("<|python_tag|>{\"name\": \"add\", \"parameters\": {\"a\":  1}}; {\"name\": \"f\"}");
        assert_eq!(content, "");
        assert_eq!(
            calls,
            vec![(String::from("add"), String::from("{\"a\":  1}")), (String::from("f"), String::from("{}"))]
        );
        let (_, calls) = parse_llama3_json(" {\"name\": \"g\", \"arguments\": {\"b\": 2}} ");
        assert_eq!(calls, vec![(String::from("g"), String::from("{\"b\": 2}"))]);
        for plain in ["The answer is {\"name\": 1}.", "{\"name\": \"g\"} and more", "{\"nam", "{\"x\": 1}", ""] {
            assert_eq!(parse_llama3_json(plain), (plain.to_owned(), Vec::new()), "{plain}");
        }
    }

    #[test]
    fn without_parallel_calls_only_the_first_is_kept() {
        let two = "<tool_call>{\"name\": \"a\"}</tool_call><tool_call>{\"name\": \"b\"}</tool_call>";
        assert_eq!(CallFormat::Hermes.parse(two, true).1.len(), 2);
        assert_eq!(CallFormat::Hermes.parse(two, false).1, vec![(String::from("a"), String::from("{}"))]);
        assert_eq!(CallFormat::Llama3Json.parse("{\"name\": \"a\"}; {\"name\": \"b\"}", false).1.len(), 1);
    }

    #[test]
    fn auto_takes_the_format_the_template_renders_calls_in() {
        let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../rl-model/tests/fixtures/chat");
        let template = |name: &str| ChatTemplate::load(&fixtures.join(name)).unwrap();
        assert_eq!(CallFormat::resolve("auto", &template("qwen3")), Some(CallFormat::Hermes));
        assert_eq!(CallFormat::resolve("auto", &template("qwen25")), Some(CallFormat::Hermes));
        assert_eq!(CallFormat::resolve("auto", &template("llama3")), Some(CallFormat::Llama3Json));
        assert_eq!(CallFormat::resolve("hermes", &template("llama3")), Some(CallFormat::Hermes));
        assert_eq!(CallFormat::resolve("none", &template("qwen3")), None);
    }

    #[test]
    fn parses_calls_and_keeps_argument_text() {
        let (content, calls) = parse_hermes(
            "Going.<tool_call>\n{\"name\": \"click_link\", \"arguments\": {\"title\":  \"Rust\"}}\n</tool_call>",
        );
        assert_eq!(content, "Going.");
        assert_eq!(calls, vec![(String::from("click_link"), String::from("{\"title\":  \"Rust\"}"))]);
        let (content, calls) = parse_hermes("no calls here");
        assert_eq!((content.as_str(), calls.len()), ("no calls here", 0));
        let (content, calls) = parse_hermes("<tool_call>{broken</tool_call>");
        assert_eq!((content.as_str(), calls.len()), ("<tool_call>{broken</tool_call>", 0));
    }
}
