//! `EnvClient`: the orchestrator's side of the env-server protocol — waits for health, retries
//! retryable failures with backoff, bounds every call with a timeout.

use std::time::{Duration, Instant};

use rl_proto::env::v1 as pb;
use rl_proto::env::v1::env_server_client::EnvServerClient;
use tonic::transport::{Channel, Endpoint};

use crate::error::{Error, Result};

/// How an [`EnvClient`] behaves.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Timeout of one call.
    pub timeout: Duration,
    /// Retries of a retryable failure (0: none).
    pub retries: u32,
    /// First backoff; doubles each retry, capped at 10 s.
    pub backoff: Duration,
    /// Largest message sent or received.
    pub max_message_bytes: usize,
    /// The server's token, sent as `authorization: Bearer <token>` metadata on every call.
    pub token: Option<crate::ApiKey>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            timeout: Duration::from_secs(600),
            retries: 3,
            backoff: Duration::from_millis(200),
            max_message_bytes: 64 * 1024 * 1024,
            token: None,
        }
    }
}

/// A client of one env server.
#[derive(Debug, Clone)]
pub struct EnvClient {
    client: EnvServerClient<Channel>,
    address: String,
    options: ClientOptions,
}

impl EnvClient {
    /// A client for `address` (`host:port` or `http://host:port`); connects on first use.
    pub fn new(address: &str, options: ClientOptions) -> Result<Self> {
        let uri = if address.contains("://") { address.to_owned() } else { format!("http://{address}") };
        let endpoint = Endpoint::from_shared(uri.clone())
            .map_err(|e| Error::bad_request("address", format!("{address:?} is not a valid address: {e}")))?
            .connect_timeout(Duration::from_secs(5))
            .timeout(options.timeout)
            .tcp_nodelay(true);
        let client = EnvServerClient::new(endpoint.connect_lazy())
            .max_decoding_message_size(options.max_message_bytes)
            .max_encoding_message_size(options.max_message_bytes);
        Ok(EnvClient { client, address: uri, options })
    }

    /// The server's address.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Polls `Health` until it answers or `timeout` passes.
    pub async fn wait_for_health(&self, timeout: Duration) -> Result<pb::HealthResponse> {
        let start = Instant::now();
        loop {
            let mut c = self.client.clone();
            let probe = tokio::time::timeout(Duration::from_secs(2), c.health(pb::HealthRequest {})).await;
            let last = match probe {
                Ok(Ok(r)) => return Ok(r.into_inner()),
                Ok(Err(s)) => s.to_string(),
                Err(_) => String::from("health probe timed out"),
            };
            if start.elapsed() >= timeout {
                return Err(Error::Infrastructure(format!(
                    "env server {} did not become healthy within {timeout:?}: {last}",
                    self.address
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `Info`.
    pub async fn info(&self) -> Result<pb::InfoResponse> {
        self.call(|mut c| {
            let req = self.request(pb::InfoRequest {});
            async move { c.info(req).await }
        })
        .await
    }

    /// `RunGroup`, retrying retryable failures.
    pub async fn run_group(&self, req: pb::RunGroupRequest) -> Result<pb::RunGroupResponse> {
        self.call(|mut c| {
            let req = self.request(req.clone());
            async move { c.run_group(req).await }
        })
        .await
    }

    /// `RunRollout`, retrying retryable failures.
    pub async fn run_rollout(&self, req: pb::RunRolloutRequest) -> Result<pb::RunRolloutResponse> {
        self.call(|mut c| {
            let req = self.request(req.clone());
            async move { c.run_rollout(req).await }
        })
        .await
    }

    /// `RunAlgorithms`, retrying retryable failures.
    pub async fn run_algorithms(&self, req: pb::RunAlgorithmsRequest) -> Result<pb::RunAlgorithmsResponse> {
        self.call(|mut c| {
            let req = self.request(req.clone());
            async move { c.run_algorithms(req).await }
        })
        .await
    }

    /// `message` with the token's metadata, if any.
    fn request<M>(&self, message: M) -> tonic::Request<M> {
        let mut req = tonic::Request::new(message);
        if let Some(token) = &self.options.token
            && let Ok(value) = format!("Bearer {}", token.0).parse()
        {
            req.metadata_mut().insert("authorization", value);
        }
        req
    }

    async fn call<T, F, Fut>(&self, f: F) -> Result<T>
    where
        F: Fn(EnvServerClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let mut attempt = 0;
        loop {
            let err = match f(self.client.clone()).await {
                Ok(r) => return Ok(r.into_inner()),
                Err(status) => Error::from(status),
            };
            if !err.retryable() || attempt >= self.options.retries {
                return Err(err);
            }
            let backoff = self.options.backoff.saturating_mul(1 << attempt.min(16)).min(Duration::from_secs(10));
            tracing::warn!(address = %self.address, attempt, error = %err, ?backoff, "retrying env-server call");
            tokio::time::sleep(backoff + jitter(backoff)).await;
            attempt += 1;
        }
    }
}

/// Compares secrets without an early exit on the first differing byte.
pub(crate) fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Up to half of `d`, from the clock (no RNG needed to spread retries).
fn jitter(d: Duration) -> Duration {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |t| t.subsec_nanos());
    d.mul_f64(f64::from(nanos % 1000) / 2000.0)
}
