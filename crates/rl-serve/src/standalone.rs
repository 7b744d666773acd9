//! Env servers as programs. `rl env-server` and a user's own binary (a crate that implements
//! [`Environment`] outside this workspace) share this code, so every env server reads the same
//! config (`@ file.json`, `--env.args.key value`, ...) and announces itself with the same
//! `listening` line, which is what the `rl rl` launcher reads to learn its address.

use std::future::Future;
use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;

use rl_configs::{EnvServerConfig, EnvSpec, ServeConfig};

use crate::env::Environment;
use crate::server::{bind, serve};

/// Why a standalone env server stopped.
#[derive(Debug, thiserror::Error)]
pub enum StandaloneError {
    /// The command line or config file is invalid.
    #[error("the config is not valid: {0}")]
    Config(#[from] rl_configs::ConfigError),
    /// The environment could not be built from its args.
    #[error("cannot build env `{id}`: {source}")]
    Build {
        /// The env id.
        id: String,
        /// Why.
        source: crate::error::Error,
    },
    /// Binding the address failed.
    #[error("cannot bind {address}: {source}")]
    Bind {
        /// `host:port`.
        address: String,
        /// Why.
        source: std::io::Error,
    },
    /// Serving failed.
    #[error("env server failed: {0}")]
    Serve(#[from] crate::error::Error),
    /// Writing the `listening` line or starting the runtime failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// The whole `main` of an env-server binary: loads an `EnvServerConfig` from the command line
/// (like `rl env-server`), builds the env with `build(&config.env)`, serves it until SIGINT or
/// SIGTERM, and exits non-zero with the error on stderr if anything fails.
///
/// ```ignore
/// fn main() -> std::process::ExitCode {
///     rl_serve::env_server_main(|spec| Ok(std::sync::Arc::new(MyEnv::new(&spec.args)?)))
/// }
/// ```
pub fn env_server_main<F>(build: F) -> ExitCode
where
    F: FnOnce(&EnvSpec) -> crate::error::Result<Arc<dyn Environment>>,
{
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = (|| {
        let config = rl_configs::load::<EnvServerConfig>(&args)?.config;
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
        runtime.block_on(async {
            let env =
                build(&config.env).map_err(|source| StandaloneError::Build { id: config.env.id.clone(), source })?;
            announce_and_serve(env, &config.serve, &config.env.id, shutdown_signal()).await
        })
    })();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(std::io::stderr().lock(), "error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Binds, prints `{"event":"listening","address":"HOST:PORT","env":ID}` on stdout (port 0 picks a
/// free port, so parallel servers never race for one), then serves until `shutdown`.
pub async fn announce_and_serve(
    env: Arc<dyn Environment>,
    config: &ServeConfig,
    id: &str,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), StandaloneError> {
    let listener = bind(config)
        .await
        .map_err(|source| StandaloneError::Bind { address: format!("{}:{}", config.host, config.port), source })?;
    let addr = listener.local_addr()?;
    let line = serde_json::json!({"event": "listening", "address": addr.to_string(), "env": id});
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    drop(out);
    serve(env, config, listener, shutdown).await?;
    tracing::info!("env server stopped");
    Ok(())
}

/// A future that resolves on Ctrl-C, SIGTERM or SIGHUP (a closed terminal or ssh session stops a
/// server or the launcher the same way as SIGTERM).
///
/// The handlers are installed by this call, not when the future is first polled: a process that
/// has announced its address must survive a SIGTERM sent at once (until the first poll the default
/// action would kill it, which a loaded CI machine once showed). Call it inside a Tokio runtime.
#[cfg(unix)]
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{Signal, SignalKind, signal};
    // A kind that cannot be registered is waited on forever, like a signal that never comes.
    async fn next(stream: Option<Signal>) {
        match stream {
            Some(mut s) => {
                s.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    }
    let [interrupt, terminate, hangup] =
        [SignalKind::interrupt(), SignalKind::terminate(), SignalKind::hangup()].map(|kind| signal(kind).ok());
    async move {
        tokio::select! {
            () = next(interrupt) => {}
            () = next(terminate) => {}
            () = next(hangup) => {}
        }
    }
}

/// A future that resolves on Ctrl-C.
#[cfg(not(unix))]
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}
