//! `rl rl`: launches the whole system as separate processes — the embedded inference server (when
//! configured), one env server per env (started one after another, each on port 0, reporting its
//! address, so none can race another for a port), the trainer and the orchestrator — and shows one
//! progress line per step and keeps `<run>/curves.svg` current. If any process fails, the others
//! are stopped and the launcher exits non-zero naming the process and the end of its log. Children
//! run in their own process group: Ctrl-C reaches the launcher only, which stops them in order
//! (orchestrator, trainer, env servers, inference). `--resume` restarts every process from the
//! latest checkpoint both the trainer and the orchestrator completed.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rl_configs::run_dir::{MetricsRow, TrainerRow, read_jsonl};
use rl_configs::{ConfigFile, ResumeConfig, RlConfig, RunDir, write_json_atomic};

use crate::plot::rl_curves;

struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
    /// How to start it again after a crash (env servers), and how often it was.
    restart: Option<Restart>,
    /// Its failure is reported, not fatal (the tracking sidecar); `reported` once said.
    best_effort: bool,
    reported: bool,
}

/// An env server's command line on the port it reported, so a restart keeps its address (the
/// orchestrator's channel reconnects by itself).
struct Restart {
    program: Option<Vec<String>>,
    args: Vec<String>,
    done: u32,
    /// Crashes in a row, each soon after the (re)start before it: the backoff grows with them.
    quick: u32,
    started: std::time::Instant,
}

/// A server that ran this long before crashing is restarted after the shortest backoff again:
/// the backoff is for crash loops, not for the occasional crash of a long run.
const HEALTHY_RUN: Duration = Duration::from_secs(60);

impl Drop for Proc {
    /// SIGTERM to the child's process group (it leads its own: anything it started, a Python
    /// worker or the binary behind a `cargo run` command, goes too), SIGKILL after 10 s.
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let signal = |sig: &str| {
            let _ = Command::new("kill").args([sig, "--", &group]).stderr(Stdio::null()).status();
        };
        if let Ok(None) = self.child.try_wait() {
            signal("-TERM");
            // A stopped child handles TERM only once continued.
            signal("-CONT");
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(10) {
                if let Ok(Some(_)) = self.child.try_wait() {
                    // Whatever it started must not outlive it (the group id cannot have been
                    // reused yet: the group's members keep it).
                    signal("-KILL");
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            signal("-KILL");
            let _ = self.child.wait();
        }
    }
}

fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Spawns `rl <args>` (or `program <args>`) logging to `<run>/logs/<name>.log`; with `wait_line`,
/// returns the first stdout line (the server's `listening` event) and forwards the rest of stdout
/// to the log.
fn spawn(
    run: &RunDir,
    name: &str,
    program: Option<&[String]>,
    args: &[&str],
    wait_line: bool,
) -> anyhow::Result<(Proc, Option<serde_json::Value>)> {
    let (child, log, event) = spawn_child(run, name, program, args, wait_line)?;
    Ok((Proc { name: name.to_owned(), child, log, restart: None, best_effort: false, reported: false }, event))
}

/// [`spawn`] without the `Proc` (whose drop stops the child): the child, its log and its event.
fn spawn_child(
    run: &RunDir,
    name: &str,
    program: Option<&[String]>,
    args: &[&str],
    wait_line: bool,
) -> anyhow::Result<(Child, PathBuf, Option<serde_json::Value>)> {
    std::fs::create_dir_all(run.logs())?;
    let log = run.log(name);
    // Appending keeps the log of an interrupted run when it is resumed.
    let err_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .with_context(|| format!("cannot create {}", log.display()))?;
    let mut cmd = match program {
        Some([exe, first_args @ ..]) => {
            let mut cmd = Command::new(exe);
            cmd.args(first_args);
            cmd
        }
        _ => {
            let mut cmd = Command::new(std::env::current_exe().context("cannot find the rl executable")?);
            // Our own children exit if the launcher dies without stopping them (see orphan.rs).
            cmd.env(crate::orphan::LAUNCHER_PID, std::process::id().to_string());
            cmd
        }
    };
    // Own process group: a terminal Ctrl-C reaches the launcher, which stops children in order.
    cmd.args(args).stderr(err_file.try_clone()?).stdin(Stdio::null()).process_group(0);
    cmd.stdout(if wait_line { Stdio::piped() } else { Stdio::from(err_file) });
    let mut child = cmd.spawn().with_context(|| match program {
        Some(p) => format!("cannot start {name}: `{}`", p.join(" ")),
        None => format!("cannot start {name}"),
    })?;
    let mut event = None;
    if wait_line {
        let stdout = child.stdout.take().expect("piped stdout");
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        reader.read_line(&mut line)?;
        if line.trim().is_empty() {
            let _ = child.wait();
            bail!("{name} exited before reporting its address; last lines of {}:\n{}", log.display(), tail(&log, 20));
        }
        event = Some(
            serde_json::from_str(&line)
                .with_context(|| format!("{name} printed {line:?} instead of its listening event"))?,
        );
        let mut log_file = std::fs::OpenOptions::new().append(true).open(&log)?;
        std::thread::spawn(move || {
            for l in reader.lines().map_while(Result::ok) {
                let _ = writeln!(log_file, "{l}");
            }
        });
    }
    Ok((child, log, event))
}

/// The length of the streak of crashes this one belongs to, given the streak before it and how
/// long the process ran: a crash after [`HEALTHY_RUN`] starts a new streak.
fn quick_crashes(before: u32, ran: Duration) -> u32 {
    if ran >= HEALTHY_RUN { 1 } else { before + 1 }
}

/// The pause before a restart, the `streak`-th crash in a row: 1, 2, 4 ... 32 s.
fn restart_backoff(streak: u32) -> Duration {
    Duration::from_secs(1 << streak.saturating_sub(1).min(5))
}

/// Starts a crashed env server again on its address, after a backoff (1, 2, 4 s ... for crashes
/// in quick succession; 1 s again after a run of [`HEALTHY_RUN`]). What the dead process started
/// (its process group) is killed first.
fn restart(run: &RunDir, p: &mut Proc, out: &mut impl Write, why: &str, budget: u32) -> anyhow::Result<bool> {
    let Some(r) = p.restart.as_mut().filter(|r| r.done < budget) else { return Ok(false) };
    r.done += 1;
    r.quick = quick_crashes(r.quick, r.started.elapsed());
    let group = format!("-{}", p.child.id());
    let _ = Command::new("kill").args(["-KILL", "--", &group]).stderr(Stdio::null()).status();
    writeln!(out, "{} {why}; restarting it ({}/{budget}) on its address; log {}", p.name, r.done, p.log.display())?;
    std::thread::sleep(restart_backoff(r.quick));
    let args: Vec<&str> = r.args.iter().map(String::as_str).collect();
    let (child, _, _) = spawn_child(run, &p.name, r.program.as_deref(), &args, true)
        .with_context(|| format!("cannot restart {}", p.name))?;
    p.child = child;
    r.started = std::time::Instant::now();
    Ok(true)
}

/// The checkpoint step to resume from: `wanted`, or the latest step for which both the trainer
/// and the orchestrator finished a checkpoint.
fn resume_step(run: &RunDir, wanted: Option<u64>) -> anyhow::Result<u64> {
    let complete = run.complete_checkpoints();
    if let Some(s) = wanted {
        if complete.contains(&s) {
            return Ok(s);
        }
        bail!(
            "cannot resume from step {s}: {} lacks a complete trainer or orchestrator checkpoint",
            run.checkpoint(s).display()
        );
    }
    complete.last().copied().with_context(|| {
        format!(
            "cannot resume: no complete checkpoint (trainer and orchestrator) in {} (set [ckpt] interval)",
            run.checkpoints().display()
        )
    })
}

/// Runs the RL launcher for a loaded config.
pub(crate) fn rl(_command: &str, config: &RlConfig) -> anyhow::Result<()> {
    let run_dir = config.run_dir();
    let run = RunDir::new(&run_dir);
    let resume = match &config.resume {
        Some(r) => Some(resume_step(&run, r.step)?),
        None => None,
    };
    // A dry run's resolved configs are not a run: the real run with the same name may start.
    if run.has_run_output() && resume.is_none() {
        if !config.clean {
            bail!(
                "run directory {} is not empty: pass --clean to delete it or choose another --run.name",
                run_dir.display()
            );
        }
        std::fs::remove_dir_all(&run_dir).with_context(|| format!("cannot clean {}", run_dir.display()))?;
    }
    let (configs_dir, files) = config.resolved_files()?;
    for (name, value) in &files {
        write_json_atomic(&configs_dir.join(name), value)?;
    }
    let cfg_path = |rel: &str| configs_dir.join(rel).display().to_string();
    let mut procs: Vec<Proc> = Vec::new();
    let parts = config.parts();
    let mut orchestrator = parts.orchestrator;
    let mut trainer = parts.trainer;
    if let Some(step) = resume {
        // Both resume from the same, complete checkpoint (not each from its own latest).
        trainer.resume = Some(ResumeConfig { step: Some(step) });
        orchestrator.resume = Some(ResumeConfig { step: Some(step) });
        writeln!(std::io::stdout().lock(), "resuming {} from checkpoint step {step}", run_dir.display())?;
        // Before any process starts: the trainer reads `rollouts/step_N` as soon as it exists, so
        // a batch the crashed run left after the checkpoint would be trained (and its broadcast
        // deleted under the trainer) if only the orchestrator removed them, at its own start.
        let torn = rl_orchestrator::clean_after(&run, step)
            .with_context(|| format!("cannot remove the steps after {step} from {}", run_dir.display()))?;
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
    crate::interrupt::watch()?;
    if config.inference.is_some() {
        let mut args = vec![String::from("inference"), String::from("@"), cfg_path("inference.json")];
        let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let (mut p, event) = spawn(&run, "inference", None, &arg_refs, true)?;
        orchestrator.model.base_url = event
            .and_then(|e| e["base_url"].as_str().map(str::to_owned))
            .context("inference did not report base_url")?;
        // Restarted on its port; the orchestrator sees the new boot id and loads its weights again.
        if let Some(port) = crate::liveness::host_port(&orchestrator.model.base_url).and_then(|h| h.rsplit_once(':')) {
            args.extend([String::from("--port"), port.1.to_owned()]);
            p.restart = Some(Restart { program: None, args, done: 0, quick: 0, started: std::time::Instant::now() });
        }
        procs.push(p);
    }
    let mut addresses = std::collections::BTreeMap::new();
    for part in &parts.env_servers {
        let rel = format!("envs/{}/{}.json", part.split, part.name);
        let name = match part.split {
            "train" => format!("env-{}", part.name),
            split => format!("env-{split}-{}", part.name),
        };
        // A user's own env-server binary takes the same config as `rl env-server`.
        let cfg = cfg_path(&rel);
        let mut args: Vec<String> = if part.command.is_some() { vec![] } else { vec![String::from("env-server")] };
        args.extend([String::from("@"), cfg]);
        let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let (mut p, event) = spawn(&run, &name, part.command.as_deref(), &arg_refs, true)?;
        let address = event
            .and_then(|e| e["address"].as_str().map(str::to_owned))
            .context("env server did not report its address")?;
        if let Some((_, port)) = address.rsplit_once(':') {
            args.extend([String::from("--serve.port"), port.to_owned()]);
            p.restart = Some(Restart {
                program: part.command.clone(),
                args,
                done: 0,
                quick: 0,
                started: std::time::Instant::now(),
            });
        }
        addresses.insert((part.split, part.name.clone()), address);
        procs.push(p);
        if crate::interrupt::interrupted() {
            return stop_all(procs, &run);
        }
    }
    for env in &mut orchestrator.train.env {
        if let Some(a) = addresses.get(&("train", env.display_name().to_owned())) {
            // Started: the orchestrator connects to it (how it was started is the launcher's business).
            (env.address, env.command) = (Some(a.clone()), None);
        }
    }
    if let Some(eval) = &mut orchestrator.eval {
        for env in &mut eval.env {
            if let Some(a) = addresses.get(&("eval", env.display_name().to_owned())) {
                (env.address, env.command) = (Some(a.clone()), None);
            }
        }
    }
    write_json_atomic(&configs_dir.join("orchestrator.json"), &rl_configs::to_json(&orchestrator))?;
    write_json_atomic(&configs_dir.join("trainer.json"), &rl_configs::to_json(&trainer))?;
    procs.push(spawn(&run, "trainer", None, &["trainer", "@", &cfg_path("trainer.json")], false)?.0);
    procs.push(spawn(&run, "orchestrator", None, &["orchestrator", "@", &cfg_path("orchestrator.json")], false)?.0);
    if let Some(w) = config.wandb.as_ref().filter(|w| w.mode != rl_configs::WandbMode::Disabled) {
        procs.push(spawn_tracking(&run, w)?);
    }
    let watch = Liveness {
        stall_timeout: Duration::from_secs_f64(config.launcher.stall_timeout_s),
        inference: config.inference.as_ref().and(crate::liveness::host_port(&orchestrator.model.base_url)),
        max_restarts: config.launcher.max_restarts,
        tensorboard: config
            .tensorboard
            .as_ref()
            .map(|t| t.dir.clone().unwrap_or_else(|| run.root().join("tensorboard"))),
    };
    let outcome = monitor(&run, &mut procs, config.max_steps, resume.unwrap_or(0), &watch);
    if let Err(e) = rl_curves(&run) {
        tracing::warn!("could not draw the run's curves: {e:#}");
    }
    match outcome {
        Ok(Finished::Done) => {
            finish_tracking(&mut procs)?;
            stop_in_order(procs);
            export_final_model(&run, config)
        }
        Ok(Finished::Interrupted) => stop_all(procs, &run),
        Err(e) => {
            stop_in_order(procs);
            Err(e)
        }
    }
}

/// Starts the W&B sidecar following the run directory; it is best effort: if it fails the run
/// goes on, with a warning.
fn spawn_tracking(run: &RunDir, w: &rl_configs::WandbConfig) -> anyhow::Result<Proc> {
    let cmd = crate::tracking::command(run, w, false);
    let args: Vec<&str> = cmd[1..].iter().map(String::as_str).collect();
    let (mut p, _) = spawn(run, "wandb", Some(&cmd[..1]), &args, false)?;
    p.best_effort = true;
    Ok(p)
}

/// Lets the tracking sidecar send the last steps before everything is stopped.
fn finish_tracking(procs: &mut [Proc]) -> anyhow::Result<()> {
    let Some(p) = procs.iter_mut().find(|p| p.best_effort) else { return Ok(()) };
    if matches!(p.child.try_wait(), Ok(None)) {
        writeln!(std::io::stdout().lock(), "waiting for {} to send the last steps (log {})", p.name, p.log.display())?;
        crate::tracking::finish(&mut p.child);
    }
    Ok(())
}

/// Stops children newest first: the orchestrator before the trainer, env servers before inference.
fn stop_in_order(mut procs: Vec<Proc>) {
    while let Some(p) = procs.pop() {
        drop(p);
    }
}

/// The Ctrl-C path: stop everything, say how to continue, exit non-zero.
fn stop_all(procs: Vec<Proc>, run: &RunDir) -> anyhow::Result<()> {
    let _ = writeln!(std::io::stderr().lock(), "interrupted: stopping every process of {}", run.root().display());
    stop_in_order(procs);
    bail!(
        "interrupted; logs are in {}; continue from the latest checkpoint with --resume (needs [ckpt])",
        run.logs().display()
    )
}

/// Writes the last broadcast weights as an HF-format model directory at `<run>/model` (config and
/// tokenizer files from the starting model); a LoRA run's adapter goes to `<run>/adapter` as it
/// is (PEFT's format) and merged into the base as the model.
fn export_final_model(run: &RunDir, config: &RlConfig) -> anyhow::Result<()> {
    let src = config.trainer.model.path.clone().context("trainer.model.path is required")?;
    let (step, dir) = run
        .latest_broadcast()
        .with_context(|| format!("no complete weight broadcast to export in {}", run.broadcasts().display()))?;
    let cfg = rl_model::read_config(&src)?;
    let cpu = candle_core::Device::Cpu;
    let mut out = std::io::stdout().lock();
    let tensors = if rl_model::is_adapter_dir(&dir) {
        let (lora, adapters) = rl_model::read_adapter_dir(&cfg, &dir, &cpu)?;
        let mut list: Vec<_> = adapters.clone().into_iter().collect();
        list.sort_by(|a, b| a.0.cmp(&b.0));
        let base_name = std::path::absolute(&src).unwrap_or_else(|_| src.clone());
        rl_model::write_adapter_dir(&run.adapter(), &lora, &base_name.to_string_lossy(), &list)?;
        writeln!(out, "LoRA adapter (after step {step}) written to {}", run.adapter().display())?;
        rl_model::merge_adapters(&cfg, &lora, &rl_model::read_weights(&src, &cpu)?, &adapters)?
    } else {
        rl_model::read_weights(&dir, &cpu)?
    };
    let mut tensors: Vec<_> = tensors.into_iter().collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    rl_model::write_model_dir(&run.model(), &cfg, &tensors, &src)?;
    writeln!(out, "final model (after step {step}) written to {}", run.model().display())?;
    Ok(())
}

/// How long without a finished step before the launcher says what each child is doing (and
/// again as often).
const STALL_NOTICE: Duration = Duration::from_secs(120);

/// What the monitor checks when no step finishes.
struct Liveness<'a> {
    /// No step for this long stops the run (`launcher.stall_timeout_s`).
    stall_timeout: Duration,
    /// `host:port` of the launched inference server, for its `/health`.
    inference: Option<&'a str>,
    /// Restarts allowed per env server (`launcher.max_restarts`).
    max_restarts: u32,
    /// Where to mirror metrics as TensorBoard scalars (`[tensorboard]`).
    tensorboard: Option<PathBuf>,
}

/// How monitoring ended without a failure.
enum Finished {
    Done,
    Interrupted,
}

/// A warning when the latest trainer steps (`skipped`, oldest first) trained no token: at 5 in a
/// row, then each time the streak doubles; `warned` remembers the streak last warned about.
/// Reward functions that failed in a step (they score 0, so a run would otherwise learn from zeros
/// quietly): which envs, how often, and the first failure from the step's traces when still there.
fn reward_error_note(row: &MetricsRow, traces: &Path) -> Option<String> {
    let envs: Vec<String> = row
        .keyed
        .iter()
        .filter_map(|(k, v)| {
            let env = k.strip_prefix("env/")?.strip_suffix("/reward_errors")?;
            let share = v.as_f64().filter(|x| *x > 0.0)?;
            Some(format!("{env} {:.0}% of rollouts", share * 100.0))
        })
        .collect();
    if envs.is_empty() {
        return None;
    }
    let first = read_jsonl::<serde_json::Value>(traces).ok().and_then(|lines| {
        lines.iter().find_map(|t| {
            let e = t["reward_errors"].as_array()?.first()?;
            Some(format!("; first: `{}`: {}", e["name"].as_str()?, e["message"].as_str()?))
        })
    });
    Some(format!("  reward functions failed (scored 0): {}{}", envs.join(", "), first.unwrap_or_default()))
}

/// Why a step gave the trainer nothing, for its progress line (a run that trains nothing says why).
fn nothing_to_train(rollouts: &rl_configs::run_dir::RolloutMetrics) -> Option<String> {
    if rollouts.samples > 0 {
        return None;
    }
    Some(String::from(match rollouts.groups_uniform {
        Some(u) if u >= 1.0 => " | nothing to train: every group's rewards were equal",
        _ => " | nothing to train: no rollout had a trainable token",
    }))
}

fn idle_warning(skipped: impl DoubleEndedIterator<Item = bool>, warned: &mut usize) -> Option<String> {
    let idle = skipped.rev().take_while(|s| *s).count();
    if idle == 0 {
        *warned = 0;
    }
    if idle < 5 || idle < *warned * 2 {
        return None;
    }
    *warned = idle;
    Some(format!(
        "warning: the last {idle} trainer steps trained no token (every sample masked or filtered: all-equal \
         rewards with filter_zero_advantages, or loss masks); see `optimizer_skipped` in trainer/metrics.jsonl"
    ))
}

/// The metrics files mirrored into TensorBoard, each from the step after the last one written.
struct Board {
    writer: crate::tensorboard::EventWriter,
    /// The last step written of each file (`None`: none yet).
    orchestrator: Option<u64>,
    trainer: Option<u64>,
}

impl Board {
    /// Event files in `dir`; a resumed run starts after its checkpoint step `from`.
    fn open(dir: &Path, from: u64) -> anyhow::Result<Self> {
        let writer = crate::tensorboard::EventWriter::create(dir)
            .with_context(|| format!("cannot create a TensorBoard event file in {}", dir.display()))?;
        writeln!(
            std::io::stdout().lock(),
            "TensorBoard events: {} (tensorboard --logdir {})",
            writer.path().display(),
            dir.display()
        )?;
        let from = (from > 0).then_some(from);
        Ok(Board { writer, orchestrator: from, trainer: from })
    }

    /// Writes the rows that appeared since the last call (step 0, an evaluation, included).
    fn mirror(&mut self, run: &RunDir) -> anyhow::Result<()> {
        let files =
            [(run.metrics(), "", &mut self.orchestrator), (run.trainer_metrics(), "trainer/", &mut self.trainer)];
        for (path, prefix, done) in files {
            for row in read_jsonl::<serde_json::Value>(&path).unwrap_or_default() {
                let Some(step) = row["step"].as_u64() else { continue };
                if done.is_none_or(|d| step > d) {
                    self.writer.scalars(step, &row, prefix).context("cannot write a TensorBoard event")?;
                    *done = Some(step);
                }
            }
        }
        Ok(())
    }
}

/// Looks at every child (and the inference server's health).
fn look(watch: &mut crate::liveness::Watch, procs: &[Proc], inference: Option<&str>) -> crate::liveness::Report {
    let children: Vec<crate::liveness::Child<'_>> =
        procs.iter().map(|p| crate::liveness::Child { name: &p.name, pid: p.child.id() }).collect();
    watch.look(&children, inference)
}

/// Shows one line per orchestrator step after `shown` (steps up to it were shown by an earlier
/// launch when resuming) until the trainer and the orchestrator both finish.
fn monitor(
    run: &RunDir,
    procs: &mut [Proc],
    max_steps: Option<u64>,
    mut shown: u64,
    liveness: &Liveness<'_>,
) -> anyhow::Result<Finished> {
    let started = Instant::now();
    let mut watch = crate::liveness::Watch::default();
    let mut board = match &liveness.tensorboard {
        Some(dir) => Some(Board::open(dir, shown)?),
        None => None,
    };
    let mut kl = std::collections::BTreeMap::new();
    // The streak of steps that trained nothing last warned about.
    let mut warned_idle = 0;
    let mut out = std::io::stdout().lock();
    // When the last step line (or the start) was printed, and when we last said we are waiting.
    let (mut progressed, mut nagged) = (Instant::now(), Instant::now());
    loop {
        if crate::interrupt::interrupted() {
            return Ok(Finished::Interrupted);
        }
        for p in procs.iter_mut() {
            if let Some(status) = p.child.try_wait()? {
                let done = status.success() && (p.name == "trainer" || p.name == "orchestrator");
                if done || restart(run, p, &mut out, &format!("exited with {status}"), liveness.max_restarts)? {
                    continue;
                }
                if p.best_effort {
                    if !p.reported {
                        p.reported = true;
                        let log = p.log.display();
                        writeln!(
                            out,
                            "warning: {} exited with {status}; the run goes on without it. {log}:\n{}",
                            p.name,
                            tail(&p.log, 10)
                        )?;
                    }
                    continue;
                }
                // A restartable child here has used its whole budget: say so.
                let spent =
                    p.restart.as_ref().map(|r| format!(" (restarted {} times: launcher.max_restarts spent)", r.done));
                bail!(
                    "{} exited with {status}{}; last lines of {}:\n{}",
                    p.name,
                    spent.unwrap_or_default(),
                    p.log.display(),
                    tail(&p.log, 20)
                );
            }
        }
        // Whether both finished is asked before their rows are read, so the rows they wrote before
        // exiting (the last step's) are shown before "done".
        let mut finished = |name: &str| {
            procs
                .iter_mut()
                .find(|p| p.name == name)
                .is_some_and(|p| matches!(p.child.try_wait(), Ok(Some(s)) if s.success()))
        };
        let both_done = finished("trainer") && finished("orchestrator");
        // Rows are read as they are written; a row being written is skipped until complete.
        for row in read_jsonl::<TrainerRow>(&run.trainer_metrics()).unwrap_or_default() {
            kl.insert(row.step, (row.mismatch_kl, row.tokens_per_s, row.optimizer_skipped));
        }
        let orch_rows: Vec<MetricsRow> = read_jsonl(&run.metrics()).unwrap_or_default();
        let mut new_rows = false;
        for row in &orch_rows {
            let Some(rollouts) = row.rollouts.as_ref().filter(|_| row.step > shown) else { continue };
            let step = row.step;
            shown = step;
            new_rows = true;
            // The latest trained step's numbers (training of this step may still be running).
            // The latest step that trained tokens (a skipped step has no KL or speed to show).
            let trained = kl
                .values()
                .rev()
                .find(|(_, _, skipped)| !skipped)
                .map_or(String::from("trainer: no step trained yet"), |(mkl, tps, _)| {
                    format!("mismatch_kl {mkl:.1e} | trainer {tps:.0} tok/s")
                });
            if let Some(warning) = idle_warning(kl.values().map(|(_, _, skipped)| *skipped), &mut warned_idle) {
                writeln!(out, "{warning}")?;
            }
            writeln!(
                out,
                "step {step}{} | reward {:.4} | {trained}{} | elapsed {:.0}s",
                max_steps.map(|m| format!("/{m}")).unwrap_or_default(),
                rollouts.reward_mean,
                nothing_to_train(rollouts).unwrap_or_default(),
                started.elapsed().as_secs_f64()
            )?;
            if let Some(note) = reward_error_note(row, &run.traces(step)) {
                writeln!(out, "{note}")?;
            }
        }
        if let Some(b) = board.as_mut() {
            b.mirror(run)?;
        }
        if new_rows && let Err(e) = rl_curves(run) {
            tracing::warn!("could not draw the run's curves: {e:#}");
        }
        if new_rows {
            progressed = Instant::now();
        } else if progressed.elapsed() >= liveness.stall_timeout {
            // Past the limit: stop, naming who cannot be making progress and showing their logs.
            let report = look(&mut watch, procs, liveness.inference);
            let blamed: Vec<&Proc> = procs.iter().filter(|p| report.suspects.contains(&p.name)).collect();
            let shown_logs = if blamed.is_empty() { procs.iter().rev().take(2).collect() } else { blamed };
            let logs: Vec<String> = shown_logs
                .iter()
                .map(|p| format!("last lines of {}:\n{}", p.log.display(), tail(&p.log, 20)))
                .collect();
            bail!(
                "no step finished in {:.0}s (launcher.stall_timeout_s), waiting for step {}; stopping the run \
                 (--resume continues from the latest checkpoint).\n{}\n{}",
                progressed.elapsed().as_secs_f64(),
                shown + 1,
                report.lines.join("\n"),
                logs.join("\n")
            );
        } else if progressed.elapsed().min(nagged.elapsed()) >= STALL_NOTICE.min(liveness.stall_timeout / 2) {
            // A stopped or stuck process must not look like a slow step: say what each one does.
            let report = look(&mut watch, procs, liveness.inference);
            writeln!(
                out,
                "no step finished in the last {:.0}s (waiting for step {}; the run stops after {:.0}s); logs in {}:\n  {}",
                progressed.elapsed().as_secs_f64(),
                shown + 1,
                liveness.stall_timeout.as_secs_f64(),
                run.logs().display(),
                report.lines.join("\n  ")
            )?;
            nagged = Instant::now();
        }
        if both_done {
            writeln!(out, "done: run directory {} (curves: {})", run.root().display(), run.curves().display())?;
            return Ok(Finished::Done);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn restart_backoff_grows_with_crash_loops_and_starts_over_after_a_healthy_run() {
        let mut quick = 0;
        let mut pauses = Vec::new();
        for _ in 0..7 {
            quick = super::quick_crashes(quick, Duration::from_secs(2));
            pauses.push(super::restart_backoff(quick).as_secs());
        }
        assert_eq!(pauses, [1, 2, 4, 8, 16, 32, 32]);
        // A crash after a minute of serving is not part of a loop: the shortest pause again.
        quick = super::quick_crashes(quick, super::HEALTHY_RUN);
        assert_eq!(super::restart_backoff(quick).as_secs(), 1);
    }

    #[test]
    fn failed_reward_functions_are_named_under_the_step_line() {
        let row: rl_configs::run_dir::MetricsRow = serde_json::from_value(serde_json::json!({
            "step": 3, "env/arith/reward_errors": 0.25, "env/other/reward_errors": 0.0
        }))
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let traces = dir.path().join("traces.jsonl");
        assert_eq!(
            super::reward_error_note(&row, &traces).unwrap(),
            "  reward functions failed (scored 0): arith 25% of rollouts"
        );
        let line = r#"{"reward_errors": [{"name": "exact", "message": "ZeroDivisionError: division by zero"}]}"#;
        std::fs::write(&traces, format!("{{\"reward_errors\": []}}\n{line}\n")).unwrap();
        let note = super::reward_error_note(&row, &traces).unwrap();
        assert!(note.ends_with("first: `exact`: ZeroDivisionError: division by zero"), "{note}");
        let clean: rl_configs::run_dir::MetricsRow =
            serde_json::from_value(serde_json::json!({"step": 3, "env/arith/reward_errors": 0.0})).unwrap();
        assert_eq!(super::reward_error_note(&clean, &traces), None);
    }

    #[test]
    fn a_step_with_nothing_to_train_says_why_on_its_line() {
        let mut m = rl_configs::run_dir::RolloutMetrics { samples: 0, groups_uniform: Some(1.0), ..Default::default() };
        assert!(super::nothing_to_train(&m).unwrap().contains("every group's rewards were equal"));
        m.groups_uniform = Some(0.5);
        assert!(super::nothing_to_train(&m).unwrap().contains("no rollout had a trainable token"));
        m.samples = 3;
        assert_eq!(super::nothing_to_train(&m), None);
    }

    #[test]
    fn steps_that_train_nothing_are_warned_about_at_5_then_as_the_streak_doubles() {
        let mut warned = 0;
        let mut said = Vec::new();
        let mut rows = vec![false];
        for n in 1..=24 {
            rows.resize(n + 1, true);
            if let Some(w) = super::idle_warning(rows.iter().copied(), &mut warned) {
                said.push(w.split_whitespace().nth(3).unwrap().to_owned());
            }
        }
        assert_eq!(said, ["5", "10", "20"]);
        rows.push(false);
        assert!(super::idle_warning(rows.iter().copied(), &mut warned).is_none());
        assert_eq!(warned, 0, "a trained step ends the streak");
    }
}
