//! `rl inference`: the embedded inference server. After binding it prints one JSON line on stdout,
//! `{"event":"listening","address":"HOST:PORT","base_url":"http://HOST:PORT/v1"}`.

use std::io::Write;

use anyhow::Context;
use rl_configs::InferenceConfig;

use rl_serve::shutdown_signal;

/// Loads the model, binds, reports the address, serves until SIGINT or SIGTERM.
pub(crate) fn inference(_command: &str, config: &InferenceConfig) -> anyhow::Result<()> {
    crate::logging::init(&config.log);
    let server = rl_inference::Server::build(config).context("cannot start the inference server")?;
    let InferenceConfig { host, port, .. } = config;
    let runtime = crate::async_runtime::runtime()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind((host.as_str(), *port))
            .await
            .with_context(|| format!("cannot bind {host}:{port}"))?;
        let addr = listener.local_addr()?;
        // Before the address is announced: from then on a SIGTERM must stop the server cleanly.
        let shutdown = shutdown_signal();
        let line = serde_json::json!({"event": "listening", "address": addr.to_string(), "base_url": format!("http://{addr}/v1")});
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}")?;
        out.flush()?;
        drop(out);
        server.serve(listener, shutdown).await.context("inference server failed")?;
        tracing::info!("inference server stopped");
        Ok(())
    })
}
