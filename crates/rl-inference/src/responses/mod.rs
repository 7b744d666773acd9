//! OpenAI's Responses API (`POST /v1/responses`, which vLLM serves too): a request is read as the
//! chat completion it amounts to (`request.rs`: instructions and input items as messages,
//! function tools, `text.format` as `response_format`), generated on the chat path, and answered
//! as a response object with `message` and `function_call` output items (`output.rs`), or, with
//! `stream = true`, as the API's typed events (`events.rs`). Nothing is stored: a request names
//! no earlier response (`previous_response_id`), it carries the conversation.

mod events;
mod output;
mod request;

pub(crate) use self::events::events;
pub(crate) use self::output::response_object;
pub(crate) use self::request::chat_request;

use serde_json::{Map, Value};

/// What a response repeats of its request (OpenAI's response object does), and its id.
#[derive(Debug, Clone)]
pub(crate) struct Echo {
    /// `resp_<n>`.
    pub(crate) id: String,
    /// The served model's name.
    pub(crate) model: String,
    /// The request's fields a response object carries back (`instructions`, `tools`,
    /// `tool_choice`, `temperature`, `top_p`, `max_output_tokens`, `parallel_tool_calls`, `text`,
    /// `metadata`), as sent.
    pub(crate) fields: Map<String, Value>,
}

#[cfg(test)]
mod tests;
