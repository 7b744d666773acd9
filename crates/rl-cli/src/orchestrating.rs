//! `rl orchestrator`: connects to the env servers (by `address`) and the policy endpoint, then runs
//! the dispatch loop, printing one line per step (`rl eval` is `eval.rs`).

use std::io::Write;

use anyhow::Context;
use rl_configs::OrchestratorConfig;

/// Runs the orchestrator until `max_steps`.
pub(crate) fn orchestrator(_command: &str, config: &OrchestratorConfig) -> anyhow::Result<()> {
    crate::logging::init(&config.log);
    let runtime = crate::async_runtime::runtime()?;
    runtime.block_on(async {
        let mut orch = rl_orchestrator::Orchestrator::connect(config).await.context("cannot start the orchestrator")?;
        let started = std::time::Instant::now();
        orch.run(|s| {
            let Some(m) = &s.metrics.rollouts else { return };
            let mut out = std::io::stdout().lock();
            let _ = writeln!(
                out,
                "Step {} | Reward {:.4} | policy v{} | {} rollouts | stale {} | generate {:.1}s | elapsed {:.0}s",
                s.step,
                m.reward_mean,
                m.policy_version,
                m.rollouts,
                m.stale_dropped,
                m.generate_s,
                started.elapsed().as_secs_f64()
            );
        })
        .await
        .context("orchestrator failed")
    })
}
