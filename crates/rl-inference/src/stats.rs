//! Counters behind `/metrics` (Prometheus text, named as vLLM names them so its dashboards read
//! them): requests finished and failed, prompt and generated tokens, and the engine's queue.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::generation::GenOutput;

/// Request and token counters since the server started.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    succeeded: AtomicU64,
    failed: AtomicU64,
    prompt_tokens: AtomicU64,
    generation_tokens: AtomicU64,
}

impl Stats {
    /// Counts a finished request.
    pub(crate) fn record<T>(&self, prompt_len: usize, result: &Result<GenOutput, T>) {
        match result {
            Ok(out) => {
                self.succeeded.fetch_add(1, Ordering::Relaxed);
                self.prompt_tokens.fetch_add(prompt_len as u64, Ordering::Relaxed);
                let generated: usize = out.completions.iter().map(|c| c.token_ids.len()).sum();
                self.generation_tokens.fetch_add(generated as u64, Ordering::Relaxed);
            }
            Err(_) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The Prometheus exposition text; `waiting` and `running` are the engine's queue now.
    pub(crate) fn render(&self, model: &str, waiting: usize, running: usize) -> String {
        let label = format!("{{model_name=\"{}\"}}", model.replace(['"', '\\', '\n'], "_"));
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, value: u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{label} {value}");
        };
        metric("vllm:num_requests_running", "gauge", "Sequences being decoded.", running as u64);
        metric("vllm:num_requests_waiting", "gauge", "Requests waiting to be admitted.", waiting as u64);
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        metric("vllm:request_success_total", "counter", "Requests answered.", get(&self.succeeded));
        metric("rl:request_failure_total", "counter", "Requests that failed in the engine.", get(&self.failed));
        metric("vllm:prompt_tokens_total", "counter", "Prompt tokens of answered requests.", get(&self.prompt_tokens));
        metric("vllm:generation_tokens_total", "counter", "Generated tokens.", get(&self.generation_tokens));
        out
    }
}
