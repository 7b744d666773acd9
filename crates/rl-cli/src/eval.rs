//! `rl eval`: one evaluation of a served policy on every `[[eval.env]]`, a line per env and
//! `<output_dir>/eval.json`. Like verifiers' `vf-eval`, the environments need nothing started by
//! hand: an env without an `address` gets its env server spawned here (`rl env-server`, or the
//! env's own `command`; logs in `<output_dir>/logs/`), stopped when the evaluation ends however it
//! ends. The policy is the one at `model.base_url` (`rl inference`, vLLM, any OpenAI-compatible
//! server).

use std::io::Write;

use anyhow::Context;
use rl_configs::OrchestratorConfig;
use rl_run::{ConfigPart, RunDir, write_json_atomic};

use crate::launcher::{Supervisor, start_env_servers};

/// What `rl eval` needs beyond a valid orchestrator config: something to evaluate.
pub(crate) fn check(config: &OrchestratorConfig) -> anyhow::Result<()> {
    if config.eval.as_ref().is_none_or(|e| e.env.is_empty()) {
        anyhow::bail!("nothing to evaluate: add [[eval.env]] entries");
    }
    Ok(())
}

/// Evaluates the policy endpoint once on every `[[eval.env]]`.
pub(crate) fn eval(_command: &str, config: &OrchestratorConfig) -> anyhow::Result<()> {
    crate::logging::init(&config.log);
    let mut config = config.clone();
    let run = RunDir::new(&config.output_dir);
    let parts = config.eval_env_servers();
    // Dropped last: stops the spawned env servers on every way out of this function.
    let mut servers = Supervisor::without_restarts(run.clone());
    if !parts.is_empty() {
        for part in &parts {
            let path = run.config(ConfigPart::EnvServer { split: part.split, name: &part.name });
            write_json_atomic(&path, &rl_configs::to_json(&part.config))?;
            // Each evaluation's server logs start empty (the launcher appends, for resumed runs).
            let log = run.log(&format!("env-eval-{}", part.name));
            if let Err(e) = std::fs::remove_file(&log)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                return Err(e).with_context(|| format!("cannot remove the old {}", log.display()));
            }
        }
        crate::interrupt::watch()?;
        if !start_env_servers(&mut servers, &run, &parts, &mut config)? {
            anyhow::bail!("interrupted while starting the env servers");
        }
    }
    let runtime = crate::async_runtime::runtime()?;
    let result = runtime.block_on(async {
        let evaluation = async {
            let mut orch = rl_orchestrator::Orchestrator::connect_for_eval(&config)
                .await
                .context("cannot start the evaluation")?;
            orch.evaluate_now().await.context("evaluation failed")
        };
        tokio::select! {
            metrics = evaluation => metrics,
            // A spawned server that exits ends the evaluation at once, naming it with its log.
            exited = watch(&mut servers) => Err(exited),
            () = wait_for_interrupt() => Err(anyhow::anyhow!("interrupted")),
        }
    });
    let metrics = result?;
    let mut out = std::io::stdout().lock();
    for env in config.eval.iter().flat_map(|e| &e.env) {
        let name = env.display_name();
        let prefix = format!("eval/{name}/");
        let fields: Vec<String> =
            metrics.iter().filter_map(|(k, v)| Some(format!("{} {v}", k.strip_prefix(&prefix)?))).collect();
        writeln!(out, "{name} | {}", fields.join(" | "))?;
    }
    // An env whose every example failed measured nothing: the exit status says so.
    let failed: Vec<String> = config
        .eval
        .iter()
        .flat_map(|e| &e.env)
        .map(|env| env.display_name())
        .filter(|name| {
            let count = |key: &str| metrics.get(&format!("eval/{name}/{key}")).and_then(serde_json::Value::as_u64);
            count("examples") == Some(0) && count("errors").unwrap_or(0) > 0
        })
        .map(str::to_owned)
        .collect();
    let path = run.eval_result();
    write_json_atomic(&path, &serde_json::Value::Object(metrics))?;
    writeln!(out, "wrote {} and the traces {}", path.display(), run.eval_traces(0).display())?;
    if !failed.is_empty() {
        anyhow::bail!("every example of {} failed (the warnings above say why)", failed.join(", "));
    }
    Ok(())
}

/// Resolves with the error of the first spawned server that exits (never while they all run).
async fn watch(servers: &mut Supervisor) -> anyhow::Error {
    loop {
        if let Err(e) = servers.check_children(&mut std::io::sink()) {
            return e;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// Resolves once Ctrl-C or SIGTERM arrives (never when no watcher was installed).
async fn wait_for_interrupt() {
    loop {
        if crate::interrupt::interrupted() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
