//! The chat route's work: messages rendered by the chat template (`continue_final_message`,
//! `add_generation_prompt`), `tool_choice` constraints, and the reply parsed for reasoning and tool
//! calls, whole or streamed. `/v1/chat/completions` and `/v1/responses` both answer through it.

use axum::response::Response;
use rl_model::{TemplateFunction, TemplateMessage, TemplateToolCall};
use serde_json::{Value, json};

use crate::api::{ChatMessage, ChatRequest, content_text};
use crate::error::{Error, Result};
use crate::state::{AppState, finish_reason};
use crate::stream::Kind;
use crate::structured::{Constraint, JsonStyle};
use crate::tool_calls::{ToolChoice, tool_choice};

pub(crate) fn template_messages(messages: &[ChatMessage]) -> Result<Vec<TemplateMessage>> {
    messages
        .iter()
        .map(|m| {
            // OpenAI's `developer` role (its newer name for system instructions, which the OpenAI
            // SDK and agent frameworks send) is a system message to chat templates, which know no other.
            let role = if m.role == "developer" { "system" } else { m.role.as_str() };
            if !["system", "user", "assistant", "tool"].contains(&role) {
                return Err(Error::BadRequest(format!(
                    "unknown message role {:?} (expected system, developer, user, assistant or tool)",
                    m.role
                )));
            }
            let tool_calls = m
                .tool_calls
                .iter()
                .flatten()
                .map(|c| {
                    let f = &c["function"];
                    let arguments = match &f["arguments"] {
                        Value::String(s) => s.clone(),
                        Value::Null => String::from("{}"),
                        other => other.to_string(),
                    };
                    Ok(TemplateToolCall {
                        kind: String::from("function"),
                        function: TemplateFunction {
                            name: f["name"]
                                .as_str()
                                .ok_or_else(|| Error::BadRequest(String::from("a tool call has no function.name")))?
                                .to_owned(),
                            arguments,
                        },
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(TemplateMessage {
                role: role.to_owned(),
                content: content_text(m.content.as_ref())?,
                tool_calls,
                reasoning_content: m.reasoning_content.clone(),
            })
        })
        .collect()
}

/// A chat completion: the whole body, or (`stream = true`) its server-sent events.
pub(crate) enum ChatReply {
    Whole(Value),
    Stream(Response),
}

/// Answers a chat completion request (the chat route's work, which `/v1/responses` shares).
pub(crate) async fn chat_reply(s: &AppState, req: ChatRequest) -> Result<ChatReply> {
    if req.messages.is_empty() {
        return Err(Error::BadRequest(String::from("messages must not be empty")));
    }
    if req.sampling.echo {
        return Err(Error::BadRequest(String::from("echo is supported on /v1/completions, not on chat completions")));
    }
    let messages = template_messages(&req.messages)?;
    let tools = req.tools.clone().unwrap_or_default();
    let choice = tool_choice(req.tool_choice.as_ref(), &tools)?;
    let text = chat_text(
        s,
        &messages,
        &tools,
        (req.add_generation_prompt, req.continue_final_message),
        &req.chat_template_kwargs,
    )?;
    let prompt = s.encode(&text)?;
    let mut gen_req = req.sampling.to_request(prompt.clone(), &s.limits, s.next_seed())?;
    let format = s.tool_format.filter(|_| choice != ToolChoice::None && !tools.is_empty());
    // The calls a forcing tool_choice asks for: of one named tool (one call), or any (several
    // unless parallel_tool_calls is false).
    let forced = match &choice {
        ToolChoice::Required => Some((None, req.parallel_tool_calls)),
        ToolChoice::Named(name) => Some((Some(name.as_str()), false)),
        ToolChoice::None | ToolChoice::Auto => None,
    };
    if let Some((only, many)) = forced {
        // The calls are written in the model's call format and parsed back into `tool_calls`.
        let Some(format) = format else {
            return Err(Error::BadRequest(format!(
                "tool_choice {} needs a tool-call parser; this server has none (inference.tool_call_parser = \"none\")",
                req.tool_choice.as_ref().map_or_else(String::new, ToString::to_string),
            )));
        };
        let calls = Constraint::tool_calls(&tools, only, many, format);
        if gen_req.guide.is_some() {
            return Err(Error::BadRequest(String::from(
                "tool_choice that requires a call cannot be combined with another structured-output constraint",
            )));
        }
        // Arguments a tool does not declare are closed out: no caller can use them.
        let style = JsonStyle { closed_objects: true, ..JsonStyle::default() };
        gen_req.guide = Some(s.limits.grammars.compile(&calls, style)?);
    }
    // A thinking model's reply splits into reasoning and content (`inference.reasoning_parser`).
    let reasoning = s.reasoning.map(|p| (p, crate::reasoning::prompt_opens_thinking(&text)));
    if req.sampling.stream {
        let calls = format.map(|f| (f, req.parallel_tool_calls));
        let how = crate::stream::Parse { calls, reasoning };
        let events = crate::stream::respond(s.clone(), Kind::Chat, gen_req, req.sampling.clone(), prompt, how);
        return Ok(ChatReply::Stream(events));
    }
    let out = s.run(gen_req).await?;
    let choices: Vec<Value> = out
        .completions
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let parts = reasoning.map(|(p, opened)| p.parts(opened, &c.text, true));
            let answer = parts.as_ref().map_or(c.text.as_str(), |p| &c.text[p.content.clone()]);
            let (content, calls) = format
                .map_or_else(|| (answer.to_owned(), Vec::new()), |f| f.parse(answer, req.parallel_tool_calls));
            let mut message = json!({"role": "assistant", "content": content});
            if let Some(p) = &parts {
                // vLLM's field, and the name its newer releases and OpenAI-style clients read.
                let thought = Some(&c.text[p.reasoning.clone()]).filter(|r| !r.is_empty());
                message["reasoning_content"] = json!(thought);
                message["reasoning"] = json!(thought);
            }
            if !calls.is_empty() {
                message["tool_calls"] = Value::Array(
                    calls
                        .iter()
                        .enumerate()
                        .map(|(j, (name, args))| json!({"id": format!("call_{i}_{j}"), "type": "function", "function": {"name": name, "arguments": args}}))
                        .collect(),
                );
            }
            let mut choice = json!({
                "index": i,
                "message": message,
                "finish_reason": finish_reason(c, !calls.is_empty()),
                "logprobs": if req.sampling.wants_logprobs() {
                    json!({"content": c.logprobs.iter().map(|t| s.token_json(t)).collect::<Vec<_>>()})
                } else { Value::Null },
            });
            if req.sampling.return_token_ids {
                choice["token_ids"] = json!(c.token_ids);
            }
            choice
        })
        .collect();
    Ok(ChatReply::Whole(s.response_body("chatcmpl", "chat.completion", choices, &prompt, &out, &req.sampling)))
}

/// A chat's prompt text: the template with the request's variables, ending (`add_generation_prompt`,
/// `continue_final_message`) with the assistant's header, or in the final message left open.
pub(crate) fn chat_text(
    s: &AppState,
    messages: &[TemplateMessage],
    tools: &[Value],
    (add_generation_prompt, continued): (Option<bool>, bool),
    kwargs: &serde_json::Map<String, Value>,
) -> Result<String> {
    let text = s.template.render_with(messages, tools, generation_prompt(add_generation_prompt, continued)?, kwargs)?;
    if continued { open_final_message(text, messages) } else { Ok(text) }
}

/// Whether the template adds the assistant's header (`add_generation_prompt`, unset: unless the
/// final message is continued), refusing it together with `continue_final_message` as vLLM and
/// transformers do.
fn generation_prompt(add: Option<bool>, continued: bool) -> Result<bool> {
    match (add, continued) {
        (Some(true), true) => Err(Error::BadRequest(String::from(
            "continue_final_message and add_generation_prompt cannot both be true (set add_generation_prompt to false)",
        ))),
        (add, continued) => Ok(add.unwrap_or(!continued)),
    }
}

/// The prompt cut right after the final message's content, so the reply continues it
/// (`continue_final_message`), as transformers cuts it: at the last occurrence of the content,
/// or of the content trimmed (templates such as Llama 3.1's trim messages).
fn open_final_message(mut text: String, messages: &[TemplateMessage]) -> Result<String> {
    let content = messages.last().map_or("", |m| m.content.as_str());
    if content.trim().is_empty() {
        return Err(Error::BadRequest(String::from("continue_final_message needs a final message with content")));
    }
    let end = [content, content.trim()].iter().find_map(|c| text.rfind(c).map(|at| at + c.len()));
    match end {
        Some(end) => {
            text.truncate(end);
            Ok(text)
        }
        None => Err(Error::BadRequest(String::from(
            "continue_final_message: the chat template does not render the final message's content as written",
        ))),
    }
}
