//! `rl env-server`: serves one built-in environment over gRPC, announcing its address with the
//! `listening` line of `rl_serve::announce_and_serve` (shared with users' own env-server binaries).

use anyhow::Context;
use rl_configs::EnvServerConfig;

/// Runs the server until SIGINT or SIGTERM, then drains in-flight requests.
pub(crate) fn run(_command: &str, config: &EnvServerConfig) -> anyhow::Result<()> {
    let EnvServerConfig { env: spec, serve, log, .. } = config;
    crate::logging::init(log);
    let runtime = crate::async_runtime::runtime()?;
    runtime.block_on(async {
        let args: serde_json::Map<String, serde_json::Value> = spec.args.clone().into_iter().collect();
        let env = rl_envs::load(&spec.id, &args).await.with_context(|| format!("cannot build env `{}`", spec.id))?;
        rl_serve::announce_and_serve(env, serve, &spec.id, rl_serve::shutdown_signal()).await?;
        Ok(())
    })
}
