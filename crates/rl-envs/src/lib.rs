//! Built-in environments with deterministic synthetic datasets (no downloads): `reverse-text`,
//! `alphabet-sort`, `wiki-nav` (tool use) and `debate` (multi-agent); `dataset`, single-turn tasks
//! from JSONL files; `python`, which hosts an environment written with the `rl_env` Python package;
//! and `verifiers`, which hosts a verifiers v1 environment unchanged. [`load`] builds one by id from its `args` table.
//!
//! Depends on rl-serve only; it must never depend on candle or on the orchestrator.

mod alphabet_sort;
mod args;
mod dataset;
mod debate;
pub mod difflib;
mod python;
mod reverse_text;
mod rng;
mod splits;
mod verifiers;
mod wiki_nav;

use std::sync::Arc;

pub use alphabet_sort::{
    AlphabetSort, NEW_MARK, score as alphabet_sort_reward, turn_scores as alphabet_sort_turn_scores,
};
pub use dataset::FileDataset;
pub use debate::{DEBATER_A, DEBATER_B, Debate, JUDGE, stated_answer, verdict};
pub use python::PythonEnv;
pub use reverse_text::{
    ReverseText, SYSTEM_PROMPT as REVERSE_TEXT_SYSTEM_PROMPT, lcs_reward, parse_answer as parse_reversed_text,
};
use rl_serve::{Environment, Error, Result};
use serde_json::{Map, Value};
pub use verifiers::VerifiersEnv;
pub use wiki_nav::{
    Action, Game, Graph, TEXT_PROMPT as WIKI_NAV_TEXT_PROMPT, TOOLS_PROMPT as WIKI_NAV_TOOLS_PROMPT, WikiNav,
    parse_text_action, tool_action,
};

/// Ids of the built-in environments.
pub const ENV_IDS: &[&str] = &["reverse-text", "alphabet-sort", "wiki-nav", "debate", "dataset", "python", "verifiers"];

/// A built-in task's demonstrations for a supervised warm start: ideal conversations and the
/// tools their prompts offer (the same as the env's, so SFT renders what RL will).
#[derive(Debug, Clone)]
pub struct Demonstrations {
    /// Conversations, each ending with the model's last ideal reply.
    pub conversations: Vec<Vec<rl_serve::Message>>,
    /// Tools offered in every conversation's prompt.
    pub tools: Vec<rl_serve::ToolSpec>,
}

/// Ideal conversations of a built-in task for supervised warm-up: `split` of the env built from
/// `args` (so SFT data follows exactly the RL task's format and distribution).
pub fn demonstrations(id: &str, args: &Map<String, Value>, split: &str) -> Result<Demonstrations> {
    let plain = |conversations| Demonstrations { conversations, tools: Vec::new() };
    match id.replace('_', "-").as_str() {
        "reverse-text" => Ok(plain(ReverseText::new(args)?.sft_conversations(split))),
        "alphabet-sort" => Ok(plain(AlphabetSort::new(args)?.sft_conversations(split))),
        "wiki-nav" => {
            let env = WikiNav::new(args)?;
            Ok(Demonstrations { conversations: env.sft_conversations(split), tools: env.tool_specs() })
        }
        "debate" => Ok(plain(Debate::new(args)?.sft_conversations(split)?)),
        _ => Err(Error::bad_request(
            "data.task",
            format!("no SFT generator for {id:?}; built in: reverse-text, alphabet-sort, wiki-nav, debate"),
        )),
    }
}

/// Demonstrations to train a task's tokenizer on: 2,000 training conversations with the default
/// args, split over the harnesses where the task has several (wiki-nav's tools and text), so
/// one vocabulary serves each.
pub fn tokenizer_corpus(id: &str) -> Result<Vec<Demonstrations>> {
    let args = |n: u64, harness: Option<&str>| {
        let mut a = Map::from_iter([(String::from("num_examples"), Value::from(n))]);
        if let Some(h) = harness {
            a.insert(String::from("harness"), Value::from(h));
        }
        a
    };
    match id.replace('_', "-").as_str() {
        "wiki-nav" => ["tools", "text"].iter().map(|h| demonstrations(id, &args(1000, Some(h)), "train")).collect(),
        "debate" => {
            let mut a = args(2000, None);
            a.insert(String::from("positions"), Value::from("free"));
            Ok(vec![demonstrations(id, &a, "train")?])
        }
        _ => Ok(vec![demonstrations(id, &args(2000, None), "train")?]),
    }
}

/// Builds the environment `id` from its args (`_` and `-` are interchangeable in the id).
/// `python` starts the user's Python environment (see [`PythonEnv::start`]).
pub async fn load(id: &str, args: &Map<String, Value>) -> Result<Arc<dyn Environment>> {
    match id.replace('_', "-").as_str() {
        "python" => Ok(Arc::new(PythonEnv::start(args).await?)),
        "verifiers" => Ok(Arc::new(VerifiersEnv::start(args).await?)),
        "reverse-text" => Ok(Arc::new(ReverseText::new(args)?)),
        "alphabet-sort" => Ok(Arc::new(AlphabetSort::new(args)?)),
        "wiki-nav" => Ok(Arc::new(WikiNav::new(args)?)),
        "debate" => Ok(Arc::new(Debate::new(args)?)),
        "dataset" => Ok(Arc::new(FileDataset::new(args)?)),
        _ => Err(Error::bad_request("env.id", format!("unknown environment {id:?}; built in: {}", ENV_IDS.join(", ")))),
    }
}
