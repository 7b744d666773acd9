//! The gRPC service: bounded concurrency (episodes), bounded message size, per-request timeout,
//! cancellation when the client goes away (handler futures are dropped, and every rollout runs
//! inside them), and graceful shutdown.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use prost::Message as _;
use rl_configs::ServeConfig;
use rl_proto::env::v1 as pb;
use rl_proto::env::v1::env_server_server::{EnvServer, EnvServerServer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tonic::{Request, Response, Status};

use crate::algorithms::{EnvAlgorithm, check_outputs, default_algorithms};
use crate::env::Environment;
use crate::episode::RolloutRequest;
use crate::error::{Error, Result};
use crate::model_client::ModelClient;
use crate::multi_rollout::run_multi_agent_episode;
use crate::rollout::{new_id, run_episode};

/// The request's extra model runtimes by key, validated.
fn runtimes(models: &std::collections::HashMap<String, pb::ModelRuntime>) -> Result<BTreeMap<String, ModelRuntime>> {
    models.iter().map(|(k, m)| Ok((k.clone(), ModelRuntime::from_wire(m, &format!("models.{k}"))?))).collect()
}
use crate::trace::check_trace;
use crate::types::{ModelRuntime, RequestContext, Task};

/// Largest group accepted in one request.
pub const MAX_GROUP_SIZE: u32 = 4096;

/// The env-server gRPC service for one environment.
#[derive(Clone)]
pub struct EnvService {
    inner: Arc<Inner>,
}

struct Inner {
    env: Arc<dyn Environment>,
    models: ModelClient,
    gate: Semaphore,
    max_concurrent: u32,
    request_timeout: Duration,
    max_message_bytes: usize,
    algorithms: BTreeMap<String, Arc<dyn EnvAlgorithm>>,
    /// Every call but `Health` must carry it (`authorization: Bearer <token>`).
    token: Option<Arc<str>>,
}

impl std::fmt::Debug for EnvService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnvService").field("env", &self.inner.env.id()).finish()
    }
}

impl EnvService {
    /// A service for `env` with the limits of `config` (its token read from `token_env`).
    pub fn new(env: Arc<dyn Environment>, config: &ServeConfig) -> Result<Self> {
        let mut algorithms = default_algorithms();
        for algorithm in env.algorithms() {
            algorithms.insert(algorithm.id().to_owned(), algorithm);
        }
        let token = match &config.token_env {
            Some(var) => Some(Arc::from(
                rl_configs::secret_from_env("serve.token_env", var)
                    .map_err(|e| Error::bad_request("serve.token_env", e.to_string()))?,
            )),
            None => None,
        };
        Ok(EnvService {
            inner: Arc::new(Inner {
                env,
                models: ModelClient::new(),
                gate: Semaphore::new(config.max_concurrent as usize),
                max_concurrent: config.max_concurrent,
                request_timeout: Duration::from_secs_f64(config.request_timeout_s),
                max_message_bytes: usize::try_from(config.max_message_bytes).unwrap_or(usize::MAX),
                algorithms,
                token,
            }),
        })
    }

    /// Passes a call that carries the server's token (or any call when there is none).
    fn authorize<T>(&self, req: &Request<T>) -> Result<()> {
        let Some(token) = &self.inner.token else { return Ok(()) };
        let given = req.metadata().get("authorization").and_then(|v| v.to_str().ok()).and_then(bearer);
        match given {
            Some(t) if crate::client::same_secret(t.as_bytes(), token.as_bytes()) => Ok(()),
            Some(_) => Err(Error::Unauthenticated(String::from("wrong token"))),
            None => Err(Error::Unauthenticated(String::from(
                "this env server requires a token (metadata `authorization: Bearer <token>`)",
            ))),
        }
    }

    /// The tonic server wrapper, with message-size limits. Requests over `max_message_bytes` are
    /// answered INVALID_ARGUMENT by the handlers; tonic's own limit is a backstop at twice that.
    pub fn into_server(self) -> EnvServerServer<EnvService> {
        let backstop = self.inner.max_message_bytes.saturating_mul(2);
        EnvServerServer::new(self).max_decoding_message_size(backstop).max_encoding_message_size(backstop)
    }

    /// Refuses a request over `max_message_bytes`, blaming the largest of its `parts` (field, bytes).
    fn check_size(&self, what: &str, len: usize, parts: &[(&str, usize)]) -> Result<()> {
        if len > self.inner.max_message_bytes {
            let largest = parts.iter().max_by_key(|(_, n)| *n).map_or(what, |(name, _)| name);
            return Err(Error::bad_request(
                largest,
                format!(
                    "{what} is {len} bytes, more than the server's max_message_bytes ({}); send less data per request",
                    self.inner.max_message_bytes
                ),
            ));
        }
        Ok(())
    }

    fn task(&self, example: Option<&pb::ExampleRef>) -> Result<Task> {
        let source = example.and_then(|e| e.source.as_ref()).ok_or_else(|| {
            Error::bad_request("example", "set either `example.dataset` (split + index) or `example.inline_json`")
        })?;
        match source {
            pb::example_ref::Source::Dataset(d) => self.inner.env.task(&d.split, d.index),
            pb::example_ref::Source::InlineJson(json) => {
                let data: serde_json::Value = serde_json::from_str(json)
                    .map_err(|e| Error::bad_request("example.inline_json", format!("is not valid JSON: {e}")))?;
                self.inner.env.inline_task(data)
            }
        }
    }

    /// One episode: a single trace, or one trace per member for a multi-agent env.
    async fn episode(
        &self,
        task: &Task,
        actor: &ModelRuntime,
        index: u32,
        ctx: Option<&RequestContext>,
        models: &BTreeMap<String, ModelRuntime>,
    ) -> pb::Episode {
        let _permit = self.inner.gate.acquire().await.expect("the gate is never closed");
        let req = RolloutRequest { task, actor, index, training_context: ctx, models };
        if let Some(runner) = self.inner.env.episode_runner() {
            let mut traces = runner.run_episode(req).await;
            for trace in &mut traces {
                trace.task_json = task.data.to_string();
                trace.task_key.clone_from(&task.key);
                trace.scored_with = ctx.map(|c| c.wire.clone());
            }
            return pb::Episode { id: new_id(), task_key: task.key.clone(), traces, ..Default::default() };
        }
        match self.inner.env.multi_agent() {
            Some(ma) => run_multi_agent_episode(ma, &self.inner.models, req, models).await,
            None => {
                let trace = run_episode(&*self.inner.env, &self.inner.models, req).await;
                pb::Episode { id: new_id(), task_key: task.key.clone(), traces: vec![trace], ..Default::default() }
            }
        }
    }

    async fn with_timeout<T>(&self, fut: impl Future<Output = Result<T>>) -> Result<T> {
        tokio::time::timeout(self.inner.request_timeout, fut).await.unwrap_or_else(|_| {
            Err(Error::Timeout(format!("request took longer than the server's {:?} limit", self.inner.request_timeout)))
        })
    }

    async fn group(&self, req: pb::RunGroupRequest) -> Result<pb::RunGroupResponse> {
        let parts = request_parts(req.example.as_ref(), req.actor.as_ref(), req.training_context.as_ref(), &req.models);
        self.check_size("RunGroupRequest", req.encoded_len(), &parts)?;
        if req.group_size == 0 || req.group_size > MAX_GROUP_SIZE {
            return Err(Error::bad_request(
                "group_size",
                format!("must be in 1..={MAX_GROUP_SIZE}, got {}", req.group_size),
            ));
        }
        let task = self.task(req.example.as_ref())?;
        let actor = ModelRuntime::from_wire(&req.actor.unwrap_or_default(), "actor")?;
        let models = runtimes(&req.models)?;
        // Decoded once for the whole group.
        let ctx = req.training_context.map(RequestContext::from_wire);
        let episodes =
            join_all((0..req.group_size).map(|i| self.episode(&task, &actor, i, ctx.as_ref(), &models))).await;
        Ok(pb::RunGroupResponse { episodes })
    }

    async fn rollout(&self, req: pb::RunRolloutRequest) -> Result<pb::RunRolloutResponse> {
        let parts = request_parts(req.example.as_ref(), req.actor.as_ref(), req.training_context.as_ref(), &req.models);
        self.check_size("RunRolloutRequest", req.encoded_len(), &parts)?;
        let task = self.task(req.example.as_ref())?;
        let actor = ModelRuntime::from_wire(&req.actor.unwrap_or_default(), "actor")?;
        let models = runtimes(&req.models)?;
        let ctx = req.training_context.map(RequestContext::from_wire);
        let episode = self.episode(&task, &actor, 0, ctx.as_ref(), &models).await;
        Ok(pb::RunRolloutResponse { episode: Some(episode) })
    }

    async fn algorithms(&self, req: pb::RunAlgorithmsRequest) -> Result<pb::RunAlgorithmsResponse> {
        let parts = [
            ("algorithms", req.algorithms.iter().map(|m| m.encoded_len()).sum()),
            ("traces", req.traces.iter().map(|m| m.encoded_len()).sum()),
            ("models", req.models.values().map(|m| m.encoded_len()).sum()),
        ];
        self.check_size("RunAlgorithmsRequest", req.encoded_len(), &parts)?;
        for (i, t) in req.traces.iter().enumerate() {
            check_trace(t, &format!("traces[{i}]"))?;
            check_finite_rewards(t, &format!("traces[{i}]"))?;
        }
        let mut models = BTreeMap::new();
        for (k, m) in &req.models {
            models.insert(k.clone(), ModelRuntime::from_wire(m, &format!("models.{k}"))?);
        }
        let mut out = vec![pb::TraceAdvantages::default(); req.traces.len()];
        for (k, spec) in req.algorithms.iter().enumerate() {
            let algo = self.inner.algorithms.get(&spec.id).ok_or_else(|| {
                let known: Vec<&str> = self.inner.algorithms.keys().map(String::as_str).collect();
                Error::bad_request(
                    format!("algorithms[{k}].id"),
                    format!("unknown algorithm {:?}; this server knows {}", spec.id, known.join(", ")),
                )
            })?;
            let fields = match spec.fields_json.trim() {
                "" => serde_json::Map::new(),
                text => match serde_json::from_str(text) {
                    Ok(serde_json::Value::Object(m)) => m,
                    _ => {
                        return Err(Error::bad_request(
                            format!("algorithms[{k}].fields_json"),
                            "must be a JSON object",
                        ));
                    }
                },
            };
            let outputs = algo.run(&req.traces, &fields, &models).await?;
            check_outputs(&spec.id, &req.traces, &outputs)?;
            for (slot, outs) in out.iter_mut().zip(outputs) {
                slot.branches.extend(outs.into_iter().map(|o| pb::BranchAdvantages {
                    branch_index: o.branch_index,
                    algorithm: spec.id.clone(),
                    loss: algo.loss() as i32,
                    advantages: o.advantages,
                    mask: o.mask,
                }));
            }
        }
        Ok(pb::RunAlgorithmsResponse { traces: out })
    }
}

#[tonic::async_trait]
impl EnvServer for EnvService {
    async fn health(&self, _: Request<pb::HealthRequest>) -> Result<Response<pb::HealthResponse>, Status> {
        Ok(Response::new(pb::HealthResponse { ok: true, env_id: self.inner.env.id().to_owned() }))
    }

    async fn info(&self, req: Request<pb::InfoRequest>) -> Result<Response<pb::InfoResponse>, Status> {
        self.authorize(&req)?;
        let env = &self.inner.env;
        let mut metadata: std::collections::HashMap<String, String> = env.metadata().into_iter().collect();
        metadata.insert(String::from("max_concurrent"), self.inner.max_concurrent.to_string());
        if let Some(judge) = env.multi_agent().and_then(|ma| ma.judge()) {
            metadata.insert(String::from("judge_member"), judge);
        }
        Ok(Response::new(pb::InfoResponse {
            env_id: env.id().to_owned(),
            splits: env.splits().into_iter().map(|(name, size)| pb::SplitInfo { name, size }).collect(),
            metadata,
            member_ids: env
                .multi_agent()
                .and_then(|ma| env.task("train", 0).ok().map(|t| ma.members(&t)))
                .unwrap_or_default(),
            algorithms: self.inner.algorithms.keys().cloned().collect(),
        }))
    }

    async fn run_rollout(
        &self,
        req: Request<pb::RunRolloutRequest>,
    ) -> Result<Response<pb::RunRolloutResponse>, Status> {
        self.authorize(&req)?;
        Ok(Response::new(self.with_timeout(self.rollout(req.into_inner())).await?))
    }

    async fn run_group(&self, req: Request<pb::RunGroupRequest>) -> Result<Response<pb::RunGroupResponse>, Status> {
        self.authorize(&req)?;
        Ok(Response::new(self.with_timeout(self.group(req.into_inner())).await?))
    }

    async fn run_algorithms(
        &self,
        req: Request<pb::RunAlgorithmsRequest>,
    ) -> Result<Response<pb::RunAlgorithmsResponse>, Status> {
        self.authorize(&req)?;
        Ok(Response::new(self.with_timeout(self.algorithms(req.into_inner())).await?))
    }
}

/// The token of an `authorization: Bearer <token>` value.
/// Rewards an algorithm computes with must be numbers: one NaN makes the whole group's advantages NaN.
fn check_finite_rewards(t: &pb::Trace, at: &str) -> Result<()> {
    let finite = |what: String, v: f64| {
        if v.is_finite() { Ok(()) } else { Err(Error::bad_request(what, format!("must be finite, got {v}"))) }
    };
    finite(format!("{at}.reward"), t.reward)?;
    for (name, r) in &t.rewards {
        finite(format!("{at}.rewards.{name}"), r.score)?;
        finite(format!("{at}.rewards.{name}.weight"), r.weight)?;
    }
    for (k, r) in t.turn_rewards.iter().enumerate() {
        finite(format!("{at}.turn_rewards[{k}]"), *r)?;
    }
    Ok(())
}

/// The sizes of a rollout request's fields, for naming the one that made it too large.
fn request_parts(
    example: Option<&pb::ExampleRef>,
    actor: Option<&pb::ModelRuntime>,
    context: Option<&pb::TrainingContext>,
    models: &std::collections::HashMap<String, pb::ModelRuntime>,
) -> [(&'static str, usize); 4] {
    let example_field = match example.and_then(|e| e.source.as_ref()) {
        Some(pb::example_ref::Source::InlineJson(_)) => "example.inline_json",
        _ => "example",
    };
    [
        (example_field, example.map_or(0, |m| m.encoded_len())),
        ("actor", actor.map_or(0, |m| m.encoded_len())),
        ("training_context", context.map_or(0, |m| m.encoded_len())),
        ("models", models.values().map(|m| m.encoded_len()).sum()),
    ]
}

fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Binds the configured address (port 0 picks a free port; read it from the listener).
pub async fn bind(config: &ServeConfig) -> std::io::Result<TcpListener> {
    TcpListener::bind((config.host.as_str(), config.port)).await
}

/// How long in-flight requests may take to finish after shutdown is requested.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `env` on `listener` until `shutdown` resolves, then drains in-flight requests for at
/// most [`DRAIN_TIMEOUT`] (a client that never hangs up cannot keep the server alive).
pub async fn serve(
    env: Arc<dyn Environment>,
    config: &ServeConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<()> {
    let addr: Option<SocketAddr> = listener.local_addr().ok();
    tracing::info!(env = env.id(), ?addr, "env server listening");
    if config.token_env.is_none() && addr.is_some_and(|a| !a.ip().is_loopback()) {
        tracing::warn!(
            ?addr,
            "serving beyond loopback without a token: anyone who reaches the port can run rollouts \
             against your model endpoints (set serve.token_env)"
        );
    }
    let service = EnvService::new(env, config)?.into_server();
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    // tonic's builder-level `tcp_nodelay` applies only to sockets it binds itself: set it on the
    // accepted ones too, or responses sent after the handler awaited I/O stall ~40 ms on Nagle +
    // delayed ACK (measured: 44 ms per RunGroup at 1 in flight).
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let server =
        tonic::transport::Server::builder().add_service(service).serve_with_incoming_shutdown(incoming, async move {
            let _ = stop_rx.wait_for(|stop| *stop).await;
        });
    let deadline = async move {
        shutdown.await;
        tracing::info!("shutting down: draining in-flight requests");
        let _ = stop_tx.send(true);
        tokio::time::sleep(DRAIN_TIMEOUT).await;
    };
    tokio::select! {
        result = server => result.map_err(|e| Error::Infrastructure(format!("gRPC server failed: {e}"))),
        () = deadline => {
            tracing::warn!(?DRAIN_TIMEOUT, "requests still in flight after the drain timeout; stopping anyway");
            Ok(())
        }
    }
}
