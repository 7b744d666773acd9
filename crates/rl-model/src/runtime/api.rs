//! The runtime contract the generation engine drives: [`Runtime`], the rows a call returns
//! ([`Rows`]), and a LoRA adapter update ([`AdapterUpdate`]).

use std::sync::Arc;

use crate::config::ModelConfig;
use crate::error::{Error, Result};

/// Which logits a sequence wants from a forward call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rows {
    /// Its last new token's (what sampling the next token needs).
    Last,
    /// Every new token's (prompt log-probabilities).
    All,
}

/// What the generation engine needs of a runtime: caches that sequences own, prefixes they share
/// (a prompt prefilled once), and one forward call over many sequences.
pub trait Runtime: Send + Sized + 'static {
    /// One sequence's keys and values.
    type Cache: Send;
    /// A frozen prefix several caches continue.
    type Prefix: Clone + Send;

    /// The architecture.
    fn config(&self) -> &ModelConfig;
    /// The same runtime over `tensors`, read by [`crate::read_weights`] from `dir` (a weight
    /// update; `dir` names the source in errors). Reading happens elsewhere so a slow disk never
    /// stalls the thread that owns the runtime.
    fn with_weights(
        &self,
        dir: &std::path::Path,
        tensors: std::collections::HashMap<String, candle_core::Tensor>,
    ) -> Result<Self>;
    /// The same runtime computing `update`'s LoRA adapters over the base weights (read by
    /// [`crate::read_adapter_dir`] from `dir`).
    fn with_adapter(&self, dir: &std::path::Path, update: &AdapterUpdate) -> Result<Self>;
    /// An empty cache continuing `prefix`, with room for `capacity` own tokens.
    fn new_cache(&self, prefix: Option<&Self::Prefix>, capacity: usize) -> Self::Cache;
    /// Tokens in a cache (prefix included).
    fn cache_len(cache: &Self::Cache) -> usize;
    /// The first `len` tokens of a cache as a shareable prefix (a copy).
    fn share_first(&self, cache: &Self::Cache, len: usize) -> Result<Self::Prefix>;
    /// A whole cache frozen as a prefix (consumed).
    fn freeze(&self, cache: Self::Cache) -> Result<Self::Prefix>;
    /// Tokens in a prefix.
    fn prefix_len(prefix: &Self::Prefix) -> usize;
    /// Bytes a prefix holds.
    fn prefix_bytes(prefix: &Self::Prefix) -> usize;
    /// Appends `tokens[i]` to `caches[i]`; logits `[rows, vocab]` as `rows` asks, in order.
    fn forward_rows(&self, caches: &mut [&mut Self::Cache], tokens: &[&[u32]], rows: &[Rows]) -> Result<Vec<f32>>;

    /// Whether `tokens` can be appended to a sequence of `cached` tokens (ids in the vocabulary,
    /// the total within `max_position_embeddings`).
    fn check(&self, cached: usize, tokens: &[u32]) -> Result<()> {
        let cfg = self.config();
        if tokens.is_empty() {
            return Err(Error::Input(String::from("nothing to append")));
        }
        if let Some(bad) = tokens.iter().find(|&&i| i as usize >= cfg.vocab_size) {
            return Err(Error::Input(format!("token id {bad} is outside the vocabulary of {}", cfg.vocab_size)));
        }
        let max = cfg.max_position_embeddings;
        if cached + tokens.len() > max {
            return Err(Error::Input(format!(
                "sequence of {} tokens exceeds max_position_embeddings ({max})",
                cached + tokens.len()
            )));
        }
        Ok(())
    }
}

/// A LoRA adapter update. The CPU runtime computes the adapters apart from the base weights it
/// packed at the start; a runtime without that merges them into `base` ([`crate::merge_adapters`]).
#[derive(Debug, Clone)]
pub struct AdapterUpdate {
    /// Rank, scale and targets.
    pub lora: crate::Lora,
    /// The adapter matrices by PEFT name.
    pub adapters: std::collections::HashMap<String, candle_core::Tensor>,
    /// The base weights by HF name, for a runtime that merges (the CPU runtime needs none).
    pub base: Option<Arc<std::collections::HashMap<String, candle_core::Tensor>>>,
}
