//! Tool-call parsing of completions. `hermes` (Qwen's format) reads
//! `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks; the arguments keep their exact
//! text, so re-rendering the assistant message reproduces the tokens the model sampled.

use serde::Deserialize;
use serde_json::value::RawValue;

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

/// A request tool's `function.name`.
pub(crate) fn tool_name(tool: &serde_json::Value) -> Option<&str> {
    tool.get("function").and_then(|f| f.get("name")).and_then(serde_json::Value::as_str)
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
