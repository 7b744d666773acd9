//! `rl rl`: launches the whole system as separate processes — the embedded inference server (when
//! configured), one env server per env (started one after another, each on port 0, reporting its
//! address, so none can race another for a port), the trainer and the orchestrator — and shows one
//! progress line per step and keeps `<run>/curves.svg` current. If any process fails, the others
//! are stopped and the launcher exits non-zero naming the process and the end of its log. Children
//! run in their own process group: Ctrl-C reaches the launcher only, which stops them in order
//! (orchestrator, trainer, env servers, inference). `--resume` restarts every process from the
//! latest checkpoint both the trainer and the orchestrator completed.
//!
//! `process` spawns and stops one child, `supervisor` owns them all and acts on their exits,
//! `progress` and `stall` watch the run's metrics files, `finish` resumes and exports.

mod finish;
mod process;
mod progress;
mod stall;
mod supervisor;

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use anyhow::{Context, bail};
use rl_configs::{ConfigFile, OrchestratorConfig, ResumeConfig, RlConfig};
use rl_run::{ConfigPart, RunDir, write_json_atomic};

use self::process::{Restart, Role, spawn};
use self::progress::Progress;
use self::stall::Stall;
pub(crate) use self::supervisor::Supervisor;
use crate::plot::rl_curves;

/// Runs the RL launcher for a loaded config.
pub(crate) fn rl(_command: &str, config: &RlConfig) -> anyhow::Result<()> {
    let run = RunDir::new(config.run_dir());
    // Held to the end: a second launch on this run directory fails instead of sharing it.
    let _lock = crate::run_lock::lock_run(&run)?;
    let resume = prepare_run_dir(&run, config)?;
    process::set_child_env(&config.env_vars);
    crate::interrupt::watch()?;
    let parts = config.parts();
    let (mut orchestrator, mut trainer) = (parts.orchestrator, parts.trainer);
    if let Some(step) = resume {
        // Both resume from the same, complete checkpoint (not each from its own latest).
        trainer.resume = Some(ResumeConfig { step: Some(step) });
        orchestrator.resume = Some(ResumeConfig { step: Some(step) });
    }
    let mut sup = Supervisor::new(run.clone(), config.launcher.max_restarts);
    let inference = match config.inference {
        Some(_) => start_inference(&mut sup, &run, config.launcher.inference_servers, &mut orchestrator)?,
        None => vec![],
    };
    if !start_env_servers(&mut sup, &run, &parts.env_servers, &mut orchestrator)? {
        return interrupted(sup, &run);
    }
    if config.inference.is_none() {
        say_if_the_policy_is_not_up(&orchestrator)?;
    }
    write_json_atomic(&run.config(ConfigPart::Orchestrator), &rl_configs::to_json(&orchestrator))?;
    write_json_atomic(&run.config(ConfigPart::Trainer), &rl_configs::to_json(&trainer))?;
    for (role, part) in [(Role::Trainer, ConfigPart::Trainer), (Role::Orchestrator, ConfigPart::Orchestrator)] {
        let cmd = role.name();
        let cfg = run.config(part).display().to_string();
        sup.add(spawn(&run, role, None, &[&cmd, "@", &cfg], false)?.0);
    }
    if let Some(w) = config.wandb.as_ref().filter(|w| w.mode != rl_configs::WandbMode::Disabled) {
        let cmd = crate::tracking::command(&run, w, false);
        let args: Vec<&str> = cmd[1..].iter().map(String::as_str).collect();
        sup.add(spawn(&run, Role::Tracking, Some(&cmd[..1]), &args, false)?.0);
    }
    let tensorboard = config.tensorboard.as_ref().map(|t| t.dir.clone().unwrap_or_else(|| run.tensorboard()));
    let mut progress = Progress::new(config.max_steps, resume.unwrap_or(0), tensorboard.as_deref())?;
    let mut stall = Stall::new(Duration::from_secs_f64(config.launcher.stall_timeout_s), inference);
    let outcome = watch(&run, &mut sup, &mut progress, &mut stall);
    if let Err(e) = rl_curves(&run) {
        tracing::warn!("could not draw the run's curves: {e:#}");
    }
    match outcome? {
        Finished::Done => {
            sup.finish_tracking(&mut std::io::stdout().lock())?;
            drop(sup);
            finish::export_final_model(&run, config)
        }
        Finished::Interrupted => interrupted(sup, &run),
    }
}

/// Empties the run directory (`--clean`) or, when resuming, removes what the crashed run left
/// after the checkpoint; writes the resolved configs. Returns the checkpoint step resumed from.
fn prepare_run_dir(run: &RunDir, config: &RlConfig) -> anyhow::Result<Option<u64>> {
    let interval = config.trainer.ckpt.as_ref().map(|c| c.interval);
    let resume = config.resume.as_ref().map(|r| finish::resume_step(run, r.step, interval)).transpose()?;
    // A dry run's resolved configs are not a run: the real run with the same name may start.
    if run.has_run_output() && resume.is_none() {
        if !config.clean {
            bail!(
                "run directory {} is not empty: pass --clean to delete it or choose another --run.name",
                run.root().display()
            );
        }
        run.clear().with_context(|| format!("cannot clean {}", run.root().display()))?;
    }
    let (configs_dir, files) = config.resolved_files()?;
    for (name, value) in &files {
        write_json_atomic(&configs_dir.join(name), value)?;
    }
    if let Some(step) = resume {
        writeln!(std::io::stdout().lock(), "resuming {} from checkpoint step {step}", run.root().display())?;
        // Before any process starts: the trainer reads `rollouts/step_N` as soon as it exists, so
        // a batch the crashed run left after the checkpoint would be trained (and its broadcast
        // deleted under the trainer) if only the orchestrator removed them, at its own start.
        let torn = rl_orchestrator::clean_after(run, step)
            .with_context(|| format!("cannot remove the steps after {step} from {}", run.root().display()))?;
        if let Some(torn) = torn {
            // The launcher has no log subscriber: say it on the console.
            let line: String = torn.chars().take(120).collect();
            writeln!(
                std::io::stderr().lock(),
                "note: cut a torn last line (a crash mid-write) from {}: {line:?}",
                run.metrics().display()
            )?;
        }
    }
    Ok(resume)
}

/// Starts the embedded inference servers (`launcher.inference_servers`: the first on the
/// configured port, the others on free ones) and points the orchestrator at them; returns each
/// one's name and `host:port` for health checks.
fn start_inference(
    sup: &mut Supervisor,
    run: &RunDir,
    count: usize,
    orchestrator: &mut OrchestratorConfig,
) -> anyhow::Result<Vec<(String, String)>> {
    let cfg = run.config(ConfigPart::Inference).display().to_string();
    let (mut urls, mut health) = (Vec::new(), Vec::new());
    for index in 0..count {
        let mut args = vec![String::from("inference"), String::from("@"), cfg.clone()];
        if index > 0 {
            args.extend([String::from("--port"), String::from("0")]);
        }
        let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let (mut p, event) = spawn(run, Role::Inference { index, count }, None, &arg_refs, true)?;
        let base_url = event
            .and_then(|e| e["base_url"].as_str().map(str::to_owned))
            .with_context(|| format!("{} did not report base_url", p.name))?;
        let host = crate::liveness::host_port(&base_url).map(str::to_owned);
        // Restarted on its port; the orchestrator sees the new boot id and loads its weights again.
        if let Some((_, port)) = host.as_deref().and_then(|h| h.rsplit_once(':')) {
            args.extend([String::from("--port"), port.to_owned()]);
            p.restart = Some(Restart::new(None, args));
        }
        health.extend(host.map(|h| (p.name.clone(), h)));
        urls.push(base_url);
        sup.add(p);
    }
    orchestrator.model.base_url = rl_configs::BaseUrls::many(urls);
    Ok(health)
}

/// A policy served elsewhere that does not answer yet (vLLM still loading, or never started) is
/// said on the console: the orchestrator waits for it, and its log alone would leave the console
/// silent for minutes.
fn say_if_the_policy_is_not_up(orchestrator: &OrchestratorConfig) -> anyhow::Result<()> {
    for url in orchestrator.model.base_url.all() {
        let Some(addr) = crate::liveness::host_port(url) else { continue };
        if let Err(why) = crate::liveness::health(addr) {
            writeln!(
                std::io::stdout().lock(),
                "note: the policy server at {url} does not answer yet ({why}); the orchestrator waits up to {}s \
                 for it (orchestrator.wait_for_ready_s)",
                orchestrator.wait_for_ready_s
            )?;
        }
    }
    Ok(())
}

/// Starts the env servers one after another and points the orchestrator's envs at their
/// addresses; `false` when interrupted meanwhile.
pub(crate) fn start_env_servers(
    sup: &mut Supervisor,
    run: &RunDir,
    parts: &[rl_configs::EnvServerPart],
    orchestrator: &mut OrchestratorConfig,
) -> anyhow::Result<bool> {
    let mut addresses = BTreeMap::new();
    for part in parts {
        let cfg = run.config(ConfigPart::EnvServer { split: part.split, name: &part.name });
        // A user's own env-server binary takes the same config as `rl env-server`.
        let mut args: Vec<String> = if part.command.is_some() { vec![] } else { vec![String::from("env-server")] };
        args.extend([String::from("@"), cfg.display().to_string()]);
        let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let role = Role::EnvServer { split: part.split, name: part.name.clone() };
        let (mut p, event) = spawn(run, role, part.command.as_deref(), &arg_refs, true)?;
        let address = event
            .and_then(|e| e["address"].as_str().map(str::to_owned))
            .with_context(|| format!("{} did not report its address", p.name))?;
        if let Some((_, port)) = address.rsplit_once(':') {
            args.extend([String::from("--serve.port"), port.to_owned()]);
            p.restart = Some(Restart::new(part.command.clone(), args));
        }
        addresses.insert((part.split, part.name.clone()), address);
        sup.add(p);
        if crate::interrupt::interrupted() {
            return Ok(false);
        }
    }
    for env in &mut orchestrator.train.env {
        if let Some(a) = addresses.get(&("train", env.display_name().to_owned())) {
            // Started: the orchestrator connects to it (how it was started is the launcher's business).
            env.connect_to(a.clone());
        }
    }
    if let Some(eval) = &mut orchestrator.eval {
        for env in &mut eval.env {
            if let Some(a) = addresses.get(&("eval", env.display_name().to_owned())) {
                env.connect_to(a.clone());
            }
        }
    }
    Ok(true)
}

/// How watching the run ended without a failure.
enum Finished {
    Done,
    Interrupted,
}

/// The event loop: acts on children's exits, shows new steps, watches for stalls, until the
/// trainer and the orchestrator both finish (or Ctrl-C).
fn watch(run: &RunDir, sup: &mut Supervisor, progress: &mut Progress, stall: &mut Stall) -> anyhow::Result<Finished> {
    let mut out = std::io::stdout().lock();
    loop {
        if crate::interrupt::interrupted() {
            return Ok(Finished::Interrupted);
        }
        sup.check_children(&mut out)?;
        // Asked before the rows are read, so the rows written before exiting (the last step's)
        // are shown before "done".
        let finished = sup.run_finished();
        let stepped = progress.observe(run, &mut out)?;
        stall.check(stepped, progress.waiting_for(), sup, run, &mut out)?;
        if finished {
            writeln!(out, "done: run directory {} (curves: {})", run.root().display(), run.curves().display())?;
            return Ok(Finished::Done);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The Ctrl-C path: stop everything, say how to continue, exit non-zero.
fn interrupted(sup: Supervisor, run: &RunDir) -> anyhow::Result<()> {
    let _ = writeln!(std::io::stderr().lock(), "interrupted: stopping every process of {}", run.root().display());
    drop(sup);
    bail!(
        "interrupted; logs are in {}; continue from the latest checkpoint with --resume (needs [ckpt])",
        run.logs().display()
    )
}
