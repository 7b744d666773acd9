//! What a generation request asks of the engine (prompt, sampling, logprobs, stop ids, streaming)
//! and what it gets back (completions with their tokens and logprobs, prompt logprobs, usage
//! counts, the weights version that produced them).

use rl_configs::Temperature;
use rl_model::Penalties;

use crate::structured::Guide;

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenRequest {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Completions to sample.
    pub n: u32,
    /// Most tokens per completion.
    pub max_tokens: u32,
    /// Temperature (greedy or a scale).
    pub temperature: Temperature,
    /// Nucleus threshold.
    pub top_p: f32,
    /// Top-k (None = off).
    pub top_k: Option<usize>,
    /// Seed of choice 0 (choice i uses seed + i).
    pub seed: u64,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Token ids that end the completion (vLLM `stop_token_ids`), besides the model's own
    /// end-of-sequence ids; kept in `token_ids`, left out of the text.
    pub stop_token_ids: Vec<u32>,
    /// Top alternatives reported per sampled token.
    pub top_logprobs: u32,
    /// Also return the log-probabilities of the prompt tokens (`Some(k)`: with k alternatives).
    pub prompt_logprobs: Option<u32>,
    /// Logit adjustments before temperature (penalties, bias).
    pub penalties: Penalties,
    /// vLLM `min_p` (0 = off).
    pub min_p: f32,
    /// vLLM `ignore_eos`: end-of-sequence tokens do not end the completion.
    pub ignore_eos: bool,
    /// vLLM `allowed_token_ids` (sorted): every other token's logit is -inf.
    pub allowed_token_ids: Option<Vec<u32>>,
    /// vLLM `include_stop_str_in_output`: the stop string that ended a completion stays in its text.
    pub include_stop_str: bool,
    /// vLLM `min_tokens`: until this many tokens are out, end-of-sequence tokens cannot be
    /// sampled (their logits are -inf) and stop strings do not end the completion.
    pub min_tokens: u32,
    /// A structured-output constraint's state before the first sampled token (each choice
    /// advances its own copy).
    pub guide: Option<Guide>,
    /// Where each sampled token goes as soon as it is sampled (`stream = true`); the finished
    /// completions still come back whole.
    pub stream: Option<tokio::sync::mpsc::UnboundedSender<TokenEvent>>,
}

/// A token just sampled for choice `choice` of a streamed request.
#[derive(Debug, Clone)]
pub struct TokenEvent {
    /// The choice (0..n).
    pub choice: usize,
    /// The token and its logprobs.
    pub token: TokenLogprob,
}

/// One token's log-probability and its top alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token.
    pub id: u32,
    /// Its log-probability under the temperature-scaled distribution.
    pub logprob: f32,
    /// The most likely tokens: (id, logprob).
    pub top: Vec<(u32, f32)>,
}

/// Why a completion ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-turn token or a stop string.
    Stop,
    /// The token limit.
    Length,
}

/// One finished completion.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// Sampled ids (including a final end-of-turn token).
    pub token_ids: Vec<u32>,
    /// Per sampled token.
    pub logprobs: Vec<TokenLogprob>,
    /// Text (end-of-turn token and stop string removed).
    pub text: String,
    /// Why it ended.
    pub finish: Finish,
}

/// The result of a request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenOutput {
    /// `n` completions.
    pub completions: Vec<Completion>,
    /// Per prompt token (`None` for the first): its logprob and alternatives.
    pub prompt_logprobs: Option<Vec<Option<TokenLogprob>>>,
    /// Weight version that produced it (0 = the initial weights).
    pub weights_version: u64,
    /// Prompt tokens whose keys and values came from the prompt cache.
    pub cached_tokens: usize,
}
