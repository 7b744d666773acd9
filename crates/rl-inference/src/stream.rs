//! `stream = true`: server-sent events as OpenAI sends them. The engine hands each sampled token
//! over as it is sampled; text deltas are cut at character boundaries and hold back the last
//! characters that could still become a stop string, so the streamed text always equals the
//! non-streamed one. A thinking model's reasoning goes as `reasoning_content` deltas, split from
//! the content by the same function as a whole reply's. Replies parsed for tool calls are sent
//! whole at the end.

use std::convert::Infallible;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::api::Sampling;
use crate::error::Error;
use crate::generation::{GenOutput, GenRequest, TokenLogprob};
use crate::reasoning::ReasoningParser;
use crate::state::{AppState, finish_reason, now, usage};
use crate::tool_calls::CallFormat;

/// Chat chunks or text-completion chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Chat,
    Text,
}

/// What the stream of one choice has sent so far (bytes of its content and of its reasoning).
#[derive(Default)]
struct Choice {
    text_ids: Vec<u32>,
    sent: usize,
    sent_reasoning: usize,
    pending: Vec<TokenLogprob>,
}

/// How a chat reply is read: for tool calls (a format, and whether several calls may come), and
/// into reasoning and content (a parser, and whether the prompt opened the thinking).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Parse {
    pub(crate) calls: Option<(CallFormat, bool)>,
    pub(crate) reasoning: Option<(ReasoningParser, bool)>,
}

impl Parse {
    /// The reasoning and the content of `text` (all content without a reasoning parser).
    fn split<'t>(&self, text: &'t str, done: bool) -> (&'t str, &'t str) {
        match self.reasoning {
            Some((parser, opened)) => {
                let parts = parser.parts(opened, text, done);
                (&text[parts.reasoning], &text[parts.content])
            }
            None => ("", text),
        }
    }
}

/// Starts `req` and answers with its event stream; a reply parsed for tool calls is sent whole at
/// the end.
pub(crate) fn respond(
    s: AppState,
    kind: Kind,
    mut req: GenRequest,
    sampling: Sampling,
    prompt: Vec<u32>,
    parse: Parse,
) -> Response {
    let (calls, parse_tools) = (parse.calls, parse.calls.is_some());
    let (token_tx, mut tokens) = mpsc::unbounded_channel();
    req.stream = Some(token_tx);
    let (events, rx) = mpsc::channel::<Event>(64);
    let holdback = req.stop.iter().map(|x| x.chars().count()).max().unwrap_or(1).saturating_sub(1);
    let n = req.n as usize;
    let stop_token_ids = req.stop_token_ids.clone();
    let ids = Ids { id: format!("{}-{}", if kind == Kind::Chat { "chatcmpl" } else { "cmpl" }, s.next_seed()) };
    tokio::spawn(async move {
        let mut choices: Vec<Choice> = (0..n).map(|_| Choice::default()).collect();
        let head = |s: &AppState, choices: Value| ids.chunk(s, kind, choices);
        if kind == Kind::Chat {
            let roles: Vec<Value> = (0..n)
                .map(|i| json!({"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}))
                .collect();
            if events.send(event(&head(&s, Value::Array(roles)))).await.is_err() {
                return;
            }
        }
        let run = s.run(req);
        tokio::pin!(run);
        let result = loop {
            tokio::select! {
                result = &mut run => break result,
                Some(t) = tokens.recv() => {
                    let Some(c) = choices.get_mut(t.choice) else { continue };
                    if !s.tok.stop_ids.contains(&t.token.id) && !stop_token_ids.contains(&t.token.id) {
                        c.text_ids.push(t.token.id);
                    }
                    c.pending.push(t.token);
                    if parse_tools {
                        continue;
                    }
                    let text = s.tok.decode(&c.text_ids).unwrap_or_default();
                    let upto = safe_end(&text, holdback);
                    let (thought, answer) = parse.split(&text[..upto], false);
                    let (new_thought, new_answer) =
                        (thought.get(c.sent_reasoning..).unwrap_or(""), answer.get(c.sent..).unwrap_or(""));
                    if !new_thought.is_empty() || !new_answer.is_empty() {
                        (c.sent_reasoning, c.sent) = (thought.len(), answer.len());
                        let lps = std::mem::take(&mut c.pending);
                        let mut choice = piece(&s, kind, t.choice, new_answer, &lps, &sampling, None);
                        with_reasoning(&mut choice, new_thought);
                        if events.send(event(&head(&s, json!([choice])))).await.is_err() {
                            return; // the client went away: dropping `run` cancels the request
                        }
                    }
                }
            }
        };
        // Tokens sampled just before the request finished may still be queued.
        while let Ok(t) = tokens.try_recv() {
            if let Some(c) = choices.get_mut(t.choice) {
                c.pending.push(t.token);
            }
        }
        let out: GenOutput = match result {
            Ok(out) => out,
            Err(e) => {
                let _ = events.send(event(&json!({"error": error_body(&e)}))).await;
                let _ = events.send(Event::default().data("[DONE]")).await;
                return;
            }
        };
        for (i, c) in out.completions.iter().enumerate() {
            let state = &mut choices[i];
            let (thought, answer) = parse.split(&c.text, true);
            let (text, calls) =
                calls.map_or_else(|| (answer.to_owned(), Vec::new()), |(f, many)| f.parse(answer, many));
            let rest = text.get(state.sent..).unwrap_or_default();
            // Tokens still pending (held back, or all of them for tool replies) go with the rest.
            let lps = if parse_tools { c.logprobs.clone() } else { std::mem::take(&mut state.pending) };
            let mut last = piece(&s, kind, i, rest, &lps, &sampling, Some(finish_reason(c, !calls.is_empty())));
            with_reasoning(&mut last, thought.get(state.sent_reasoning..).unwrap_or_default());
            if !calls.is_empty() {
                last["delta"]["tool_calls"] = Value::Array(
                    calls
                        .iter()
                        .enumerate()
                        .map(|(j, (name, args))| json!({"index": j, "id": format!("call_{i}_{j}"), "type": "function", "function": {"name": name, "arguments": args}}))
                        .collect(),
                );
            }
            if events.send(event(&head(&s, json!([last])))).await.is_err() {
                return;
            }
        }
        let wants_usage =
            sampling.stream_options.as_ref().and_then(|o| o.get("include_usage")).and_then(Value::as_bool);
        if wants_usage == Some(true) {
            let mut body = head(&s, json!([]));
            body["usage"] = usage(prompt.len(), &out);
            let _ = events.send(event(&body)).await;
        }
        let _ = events.send(Event::default().data("[DONE]")).await;
    });
    let stream =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|e| (Ok::<_, Infallible>(e), rx)) });
    Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}

/// The shared id of a stream's chunks.
struct Ids {
    id: String,
}

impl Ids {
    fn chunk(&self, s: &AppState, kind: Kind, choices: Value) -> Value {
        let object = if kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" };
        let mut chunk = json!({"id": self.id, "object": object, "created": now(), "model": s.limits.model_name});
        chunk["choices"] = choices;
        chunk
    }
}

/// One choice's part of a chunk: its new text, the logprobs of the tokens behind it and, at the
/// end, why it finished.
fn piece(
    s: &AppState,
    kind: Kind,
    index: usize,
    text: &str,
    lps: &[TokenLogprob],
    sampling: &Sampling,
    finish: Option<&str>,
) -> Value {
    let logprobs = match (sampling.wants_logprobs(), kind) {
        (false, _) => Value::Null,
        (true, Kind::Chat) => json!({"content": lps.iter().map(|t| s.token_json(t)).collect::<Vec<_>>()}),
        (true, Kind::Text) => json!({
            "tokens": lps.iter().map(|t| s.tok.decode(&[t.id]).unwrap_or_default()).collect::<Vec<_>>(),
            "token_logprobs": lps.iter().map(|t| t.logprob).collect::<Vec<_>>(),
        }),
    };
    let mut choice = match kind {
        Kind::Chat => {
            json!({"index": index, "delta": {"content": text}, "logprobs": logprobs, "finish_reason": finish})
        }
        Kind::Text => json!({"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}),
    };
    if sampling.return_token_ids {
        choice["token_ids"] = json!(lps.iter().map(|t| t.id).collect::<Vec<_>>());
    }
    choice
}

/// How much of `text` can be sent: not its last `holdback` characters (a stop string may still
/// be forming) nor a trailing replacement character (half of a multi-byte character).
fn safe_end(text: &str, holdback: usize) -> usize {
    let trimmed = text.trim_end_matches('\u{FFFD}');
    if holdback == 0 {
        return trimmed.len();
    }
    // The byte offset of the `holdback`-th character from the end (0 when there are fewer).
    trimmed.char_indices().rev().nth(holdback - 1).map_or(0, |(i, _)| i)
}

/// A chat delta's reasoning, under vLLM's name and the newer one (nothing when it has none).
fn with_reasoning(choice: &mut Value, thought: &str) {
    if !thought.is_empty() {
        choice["delta"]["reasoning_content"] = json!(thought);
        choice["delta"]["reasoning"] = json!(thought);
    }
}

fn event(body: &Value) -> Event {
    Event::default().data(body.to_string())
}

fn error_body(e: &Error) -> Value {
    json!({"message": e.to_string(), "type": "internal_error"})
}

#[cfg(test)]
mod tests {
    #[test]
    fn deltas_hold_back_what_could_become_a_stop_string() {
        assert_eq!(super::safe_end("hello", 0), 5);
        assert_eq!(super::safe_end("hello", 2), 3);
        assert_eq!(super::safe_end("hé", 1), 1);
        assert_eq!(super::safe_end("ab\u{FFFD}", 0), 2);
        assert_eq!(super::safe_end("ab", 5), 0);
    }
}
