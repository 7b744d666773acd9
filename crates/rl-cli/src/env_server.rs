//! `rl env-server`: serves one built-in environment over gRPC. After binding it prints one JSON
//! line on stdout, `{"event":"listening","address":"HOST:PORT","env":"ID"}`, which launchers read
//! (port 0 picks a free port, so parallel servers never race for one).

use std::io::Write;

use anyhow::Context;
use rl_configs::EnvServerConfig;

/// Runs the server until SIGINT or SIGTERM, then drains in-flight requests.
pub(crate) fn run(_command: &str, config: &EnvServerConfig) -> anyhow::Result<()> {
    let EnvServerConfig { env: spec, serve, log, .. } = config;
    crate::logging::init(log);
    let runtime = crate::runtime()?;
    runtime.block_on(async {
        let args: serde_json::Map<String, serde_json::Value> = spec.args.clone().into_iter().collect();
        let env = rl_envs::load(&spec.id, &args).await.with_context(|| format!("cannot build env `{}`", spec.id))?;
        let listener =
            rl_serve::bind(serve).await.with_context(|| format!("cannot bind {}:{}", serve.host, serve.port))?;
        let addr = listener.local_addr()?;
        let line = serde_json::json!({"event": "listening", "address": addr.to_string(), "env": spec.id});
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}")?;
        out.flush()?;
        drop(out);
        rl_serve::serve(env, serve, listener, shutdown_signal()).await?;
        tracing::info!("env server stopped");
        Ok(())
    })
}

/// Resolves on Ctrl-C or SIGTERM.
pub(crate) async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
