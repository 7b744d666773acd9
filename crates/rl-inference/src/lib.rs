//! The embedded OpenAI-compatible inference server over `rl-model`: `/v1/chat/completions`,
//! `/v1/completions` and `/v1/responses` with the vLLM extensions RL needs (`return_token_ids`, `prompt_logprobs`,
//! `cache_salt`, `stop_token_ids`), vLLM's token-in `/inference/v1/generate`, `/v1/models`, `/health`, and admin `/update_weights`, `/pause`, `/resume`.
//! Requests that arrive together are decoded together (see `engine.rs`).
//!
//! Depends on rl-model and rl-configs; it must never depend on the orchestrator or trainer.

mod api;
mod auth;
mod chat;
mod engine;
mod error;
mod generate;
mod generation;
mod http;
mod ignored_fields;
mod prefix_cache;
mod prompt;
mod reasoning;
mod responses;
mod sampling_defaults;
mod state;
mod stats;
mod stream;
mod structured;
mod tool_calls;
mod weights;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use axum::Router;
use rl_configs::InferenceConfig;
use rl_model::{ChatTemplate, Tok};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

pub use engine::Engine;
pub use error::{Error, Result};
pub use generation::{Completion, Finish, GenOutput, GenRequest, TokenEvent, TokenLogprob};
pub use structured::Guide;

/// An id for this start of the server: pid and start time.
fn boot_id() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{}-{nanos}", std::process::id())
}

/// Whether `host` names only this machine.
fn is_loopback(host: &str) -> bool {
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// A ready server: the router and the engine behind it.
#[derive(Debug)]
pub struct Server {
    router: Router,
    /// The engine (also reachable through the admin routes).
    pub engine: Engine,
}

impl Server {
    /// Loads the model directory of `config` and starts the engine.
    pub fn build(config: &InferenceConfig) -> Result<Self> {
        let secret = |key: &str, var: &Option<String>| -> Result<Option<Arc<str>>> {
            var.as_deref()
                .map(|v| {
                    rl_configs::secret_from_env(key, v).map(Arc::from).map_err(|e| Error::BadRequest(e.to_string()))
                })
                .transpose()
        };
        let keys = auth::Keys {
            api: secret("inference.api_key_env", &config.api_key_env)?,
            admin: secret("inference.admin_key_env", &config.admin_key_env)?,
        };
        if keys.api.is_none() && !is_loopback(&config.host) {
            tracing::warn!(
                host = %config.host,
                "serving beyond loopback without an API key: anyone who reaches the port can generate and \
                 swap weights (set inference.api_key_env)"
            );
        }
        let dir = config.model.path.clone().ok_or_else(|| {
            Error::BadRequest(String::from(
                "inference.model.path must name a model directory (or a LoRA adapter directory over a local base)",
            ))
        })?;
        let device = rl_model::open_device(config.device)?;
        let compute = rl_model::compute_dtype(config.dtype);
        // An adapter directory serves over its base: unmerged where the CPU runtime computes the
        // adapters apart (f32), merged for the tensor runtime.
        let unmerged = device.is_cpu() && compute == candle_core::DType::F32;
        let (model, base_dir) = rl_model::load_model_or_adapter(&dir, &device, unmerged)?;
        let model = model.with_compute_dtype(compute);
        let tok = Tok::load(&base_dir)?;
        let template = ChatTemplate::load(&base_dir)?;
        let tool_format = tool_calls::CallFormat::resolve(&config.tool_call_parser, &template);
        let defaults = sampling_defaults::SamplingDefaults::load(config.generation_config, &base_dir)?;
        let max_model_len = config.max_model_len.map_or(model.config().max_position_embeddings, |l| l as usize);
        let cache_bytes = config.prefix_cache_mib as usize * 1024 * 1024;
        let engine =
            Engine::start(&model, tok.clone(), config.max_batch_size as usize, cache_bytes)?.with_base_dir(base_dir);
        let vocab_size = model.config().vocab_size;
        // The engine holds what it serves from (packed weights); the model read to build them, and
        // the file's bytes, are not asked for again: hand them back rather than keep them cached.
        drop(model);
        rl_kernels::release_kept_blocks();
        let model_name = rl_configs::ModelConfig { path: Some(dir), name: config.model.name.clone() }.served_name();
        let tok = Arc::new(tok);
        let state = state::AppState {
            engine: engine.clone(),
            tok: tok.clone(),
            template: Arc::new(template),
            limits: api::Limits {
                model_name,
                max_model_len,
                max_n: config.max_batch_size,
                default_seed: config.seed,
                vocab_size,
                grammars: Arc::new(structured::Grammars::new(tok, vocab_size)),
                defaults,
            },
            pending: Arc::new(Semaphore::new(config.max_pending_requests as usize)),
            timeout: Duration::from_secs_f64(config.request_timeout_s),
            stuck_after: Duration::from_secs_f64(config.stuck_after_s),
            weight_roots: Arc::new(config.weight_roots.clone()),
            tool_format,
            reasoning: reasoning::ReasoningParser::named(&config.reasoning_parser),
            counter: Arc::new(AtomicU64::new(1)),
            boot_id: Arc::from(boot_id()),
            stats: Arc::default(),
            started: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        };
        let max_body = usize::try_from(config.max_request_bytes).unwrap_or(usize::MAX);
        Ok(Server { router: http::router(state, max_body, &keys), engine })
    }

    /// Serves on `listener` (TCP_NODELAY on every connection) until `shutdown` resolves.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        use axum::serve::ListenerExt;
        let listener = listener.tap_io(|tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "cannot set TCP_NODELAY");
            }
        });
        axum::serve(listener, self.router).with_graceful_shutdown(shutdown).await
    }
}
