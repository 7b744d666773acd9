//! `rl orchestrator`: connects to the env servers (by `address`) and the policy endpoint, then runs
//! the dispatch loop, printing one line per step. `rl eval`: the same connections to the eval envs
//! only, one evaluation, a line per env and `<output_dir>/eval.json`.

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

/// Evaluates the policy endpoint once on every `[[orchestrator.eval.env]]` (running servers).
pub(crate) fn eval(_command: &str, config: &OrchestratorConfig) -> anyhow::Result<()> {
    crate::logging::init(&config.log);
    let runtime = crate::async_runtime::runtime()?;
    let metrics = runtime.block_on(async {
        let mut orch =
            rl_orchestrator::Orchestrator::connect_for_eval(config).await.context("cannot start the evaluation")?;
        orch.evaluate_now().await.context("evaluation failed")
    })?;
    let mut out = std::io::stdout().lock();
    for env in config.eval.iter().flat_map(|e| &e.env) {
        let name = env.display_name();
        let prefix = format!("eval/{name}/");
        let fields: Vec<String> =
            metrics.iter().filter_map(|(k, v)| Some(format!("{} {v}", k.strip_prefix(&prefix)?))).collect();
        writeln!(out, "{name} | {}", fields.join(" | "))?;
    }
    let path = rl_run::RunDir::new(&config.output_dir).eval_result();
    rl_run::write_json_atomic(&path, &serde_json::Value::Object(metrics))?;
    writeln!(out, "wrote {}", path.display())?;
    Ok(())
}
