//! What a request's `tool_choice` asks for, and tool-call parsing of completions. `hermes`
//! (Qwen's format) reads `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks; the
//! arguments keep their exact text, so re-rendering the assistant message reproduces the tokens
//! the model sampled.

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::error::{Error, Result};

/// A parsed call: (name, arguments as JSON text).
pub(crate) type ParsedCall = (String, String);

#[derive(Deserialize)]
struct RawCall<'a> {
    name: String,
    #[serde(borrow)]
    arguments: Option<&'a RawValue>,
}

/// Splits a completion into its content (the text before the first call) and its tool calls.
/// Text that looks like a call but is not valid JSON stays in the content.
pub(crate) fn parse_hermes(text: &str) -> (String, Vec<ParsedCall>) {
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
