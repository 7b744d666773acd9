//! `stream = true` on `/v1/responses`: the chat route's chunks read as they come and sent on as
//! the Responses API's typed events (`response.created`, `response.output_text.delta`, ...,
//! `response.completed`), each with its `sequence_number`, in the order OpenAI sends them.

use std::convert::Infallible;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::Echo;
use super::output::{base, function_call_item, message_item, reasoning_item, status, text_part, usage};

/// The events of one chat stream (`chat`, an SSE response of `chat.completion.chunk`s).
pub(crate) fn events(chat: Response, echo: Echo) -> Response {
    let (tx, rx) = mpsc::channel::<Event>(64);
    tokio::spawn(async move {
        let mut translator = Translator::new(echo);
        let mut body = chat.into_body().into_data_stream();
        let mut buf: Vec<u8> = Vec::new();
        let send = |events: Vec<Value>| {
            let tx = tx.clone();
            async move {
                for e in events {
                    let kind = e["type"].as_str().unwrap_or_default().to_owned();
                    if tx.send(Event::default().event(kind).data(e.to_string())).await.is_err() {
                        return false; // the client went away: dropping the chat stream cancels it
                    }
                }
                true
            }
        };
        if !send(translator.start()).await {
            return;
        }
        while let Some(bytes) = body.next().await {
            let Ok(bytes) = bytes else { break };
            buf.extend_from_slice(&bytes);
            // One SSE frame ends at a blank line; a frame may span reads (and split a character).
            while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
                let frame: Vec<u8> = buf.drain(..end + 2).collect();
                for line in String::from_utf8_lossy(&frame).lines() {
                    let Some(data) = line.strip_prefix("data: ") else { continue };
                    let out = match serde_json::from_str::<Value>(data) {
                        Ok(chunk) => translator.chunk(&chunk),
                        Err(_) if data == "[DONE]" => translator.end(),
                        Err(_) => continue,
                    };
                    if !send(out).await {
                        return;
                    }
                }
            }
        }
    });
    let stream =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|e| (Ok::<_, Infallible>(e), rx)) });
    Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}

/// Chat chunks in, Responses API events out: a thinking model's reasoning as one `reasoning` item,
/// the reply's text as one `message` item (each opened at its first text), its tool calls as
/// `function_call` items, closed by `response.completed` (or `response.incomplete`,
/// `response.failed`).
pub(super) struct Translator {
    echo: Echo,
    sequence: u64,
    text: String,
    /// The output index of the open message item.
    message_at: Option<usize>,
    thought: String,
    /// The output index of the reasoning item while it is open.
    reasoning_at: Option<usize>,
    output: Vec<Value>,
    finish: Option<String>,
    usage: Value,
    ended: bool,
}

impl Translator {
    pub(super) fn new(echo: Echo) -> Self {
        Translator {
            echo,
            sequence: 0,
            text: String::new(),
            message_at: None,
            thought: String::new(),
            reasoning_at: None,
            output: Vec::new(),
            finish: None,
            usage: Value::Null,
            ended: false,
        }
    }

    /// An event of `kind` with the next sequence number.
    fn event(&mut self, kind: &str, mut fields: Value) -> Value {
        fields["type"] = json!(kind);
        fields["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        fields
    }

    fn response(&self, status: &str) -> Value {
        let mut body = base(&self.echo, status);
        body["output"] = Value::Array(self.output.clone());
        body["usage"] = self.usage.clone();
        body
    }

    /// `response.created`, `response.in_progress`.
    pub(super) fn start(&mut self) -> Vec<Value> {
        let response = self.response("in_progress");
        vec![
            self.event("response.created", json!({"response": response})),
            self.event("response.in_progress", json!({"response": response})),
        ]
    }

    /// The events of one chat chunk.
    pub(super) fn chunk(&mut self, chunk: &Value) -> Vec<Value> {
        let mut out = Vec::new();
        if let Some(error) = chunk.get("error") {
            self.ended = true;
            let mut response = self.response("failed");
            response["error"] = json!({"code": "server_error", "message": error["message"]});
            out.push(self.event("response.failed", json!({"response": response})));
            return out;
        }
        if chunk.get("usage").is_some_and(|u| !u.is_null()) {
            self.usage = usage(&chunk["usage"]);
        }
        let Some(choice) = chunk["choices"].get(0) else { return out };
        let delta = &choice["delta"];
        if let Some(thought) = delta["reasoning_content"].as_str().filter(|t| !t.is_empty()) {
            let at = self.open_reasoning(&mut out);
            self.thought.push_str(thought);
            let item_id = self.output[at]["id"].clone();
            out.push(self.event(
                "response.reasoning_text.delta",
                json!({"item_id": item_id, "output_index": at, "content_index": 0, "delta": thought}),
            ));
        }
        if let Some(text) = delta["content"].as_str().filter(|t| !t.is_empty()) {
            self.close_reasoning(&mut out);
            let at = self.open_message(&mut out);
            self.text.push_str(text);
            let item_id = self.output[at]["id"].clone();
            out.push(self.event(
                "response.output_text.delta",
                json!({"item_id": item_id, "output_index": at, "content_index": 0, "delta": text, "logprobs": []}),
            ));
        }
        if let Some(finish) = choice["finish_reason"].as_str() {
            self.finish = Some(finish.to_owned());
            let calls = delta["tool_calls"].as_array().cloned().unwrap_or_default();
            self.close_reasoning(&mut out);
            if calls.is_empty() {
                self.open_message(&mut out);
            }
            self.close_message(&mut out);
            for call in &calls {
                self.function_call(call, &mut out);
            }
        }
        out
    }

    /// The reasoning item's index, opening it (`output_item.added`) first.
    fn open_reasoning(&mut self, out: &mut Vec<Value>) -> usize {
        if let Some(at) = self.reasoning_at {
            return at;
        }
        let at = self.output.len();
        let item = reasoning_item(&self.echo.id, "", "in_progress");
        self.output.push(item.clone());
        self.reasoning_at = Some(at);
        out.push(self.event("response.output_item.added", json!({"output_index": at, "item": item})));
        at
    }

    /// Closes the open reasoning item: `reasoning_text.done`, `output_item.done`.
    fn close_reasoning(&mut self, out: &mut Vec<Value>) {
        let Some(at) = self.reasoning_at.take() else { return };
        let item = reasoning_item(&self.echo.id, &self.thought, "completed");
        self.output[at] = item.clone();
        let (item_id, text) = (item["id"].clone(), self.thought.clone());
        out.push(self.event(
            "response.reasoning_text.done",
            json!({"item_id": item_id, "output_index": at, "content_index": 0, "text": text}),
        ));
        out.push(self.event("response.output_item.done", json!({"output_index": at, "item": item})));
    }

    /// The message item's index, opening it (`output_item.added`, `content_part.added`) first.
    fn open_message(&mut self, out: &mut Vec<Value>) -> usize {
        if let Some(at) = self.message_at {
            return at;
        }
        let at = self.output.len();
        let item = message_item(&self.echo.id, "", "in_progress");
        let item_id = item["id"].clone();
        self.output.push(item.clone());
        self.message_at = Some(at);
        out.push(self.event("response.output_item.added", json!({"output_index": at, "item": item})));
        let part = text_part("");
        out.push(self.event(
            "response.content_part.added",
            json!({"item_id": item_id, "output_index": at, "content_index": 0, "part": part}),
        ));
        at
    }

    /// Closes the open message item: `output_text.done`, `content_part.done`, `output_item.done`.
    fn close_message(&mut self, out: &mut Vec<Value>) {
        let Some(at) = self.message_at else { return };
        let item = message_item(&self.echo.id, &self.text, "completed");
        let item_id = item["id"].clone();
        self.output[at] = item.clone();
        let text = self.text.clone();
        out.push(self.event(
            "response.output_text.done",
            json!({"item_id": item_id, "output_index": at, "content_index": 0, "text": text, "logprobs": []}),
        ));
        let part = text_part(&text);
        out.push(self.event(
            "response.content_part.done",
            json!({"item_id": item_id, "output_index": at, "content_index": 0, "part": part}),
        ));
        out.push(self.event("response.output_item.done", json!({"output_index": at, "item": item})));
    }

    /// One tool call, whole: its item added, its arguments as one delta, then done.
    fn function_call(&mut self, call: &Value, out: &mut Vec<Value>) {
        let at = self.output.len();
        let added = function_call_item(call, "in_progress");
        let mut opening = added.clone();
        opening["arguments"] = json!("");
        let item_id = added["id"].clone();
        out.push(self.event("response.output_item.added", json!({"output_index": at, "item": opening})));
        let arguments = added["arguments"].clone();
        out.push(self.event(
            "response.function_call_arguments.delta",
            json!({"item_id": item_id, "output_index": at, "delta": arguments}),
        ));
        out.push(self.event(
            "response.function_call_arguments.done",
            json!({"item_id": item_id, "output_index": at, "arguments": arguments}),
        ));
        let done = function_call_item(call, "completed");
        self.output.push(done.clone());
        out.push(self.event("response.output_item.done", json!({"output_index": at, "item": done})));
    }

    /// The closing event, once the chat stream has ended (`[DONE]`).
    pub(super) fn end(&mut self) -> Vec<Value> {
        if self.ended {
            return Vec::new();
        }
        self.ended = true;
        let status = status(self.finish.as_deref());
        let kind = if status == "incomplete" { "response.incomplete" } else { "response.completed" };
        let response = self.response(status);
        vec![self.event(kind, json!({"response": response}))]
    }
}
