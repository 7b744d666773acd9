//! Starting and finishing the W&B sidecar (`python -m rl_env.tracking`) for `rl rl` and `rl sft`:
//! the one place that spells its command line.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use rl_configs::WandbConfig;
use rl_run::{ConfigPart, RunDir};

/// The sidecar's program and arguments for `run`; `single` when the run has one metrics file
/// (`rl sft`), so each row is sent as it arrives instead of merged with the trainer's. The files
/// it reads are named here from [`RunDir`]: the sidecar spells no run path.
pub(crate) fn command(run: &RunDir, w: &WandbConfig, single: bool) -> Vec<String> {
    let config = run.config(if single { ConfigPart::Sft } else { ConfigPart::Rl });
    let settings = serde_json::json!({
        "project": w.project, "entity": w.entity, "name": w.name, "group": w.group, "tags": w.tags, "mode": w.mode,
        "samples_every": w.samples_every, "dir": w.dir.clone().unwrap_or_else(|| run.wandb()),
        "single": single,
        "paths": {
            "metrics": run.metrics(),
            "trainer_metrics": run.trainer_metrics(),
            "traces": run.traces_template(),
            "eval_traces": run.eval_traces_template(),
            "config": config,
        },
    });
    let mut cmd = w.python.clone();
    cmd.extend(["-m", "rl_env.tracking", "--run-dir"].map(String::from));
    cmd.push(run.root().display().to_string());
    cmd.extend([String::from("--settings"), settings.to_string()]);
    cmd
}

/// Starts the sidecar for `rl sft`, logging to `log`.
pub(crate) fn start(run: &RunDir, w: &WandbConfig, log: &Path) -> anyhow::Result<Child> {
    let cmd = command(run, w, true);
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let file = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
    Command::new(&cmd[0])
        .args(&cmd[1..])
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
        .with_context(|| format!("cannot start the W&B sidecar `{}`", cmd[0]))
}

/// Lets the sidecar send the last rows and close its W&B run: SIGTERM, then up to two minutes.
/// Returns whether it ended within that time.
pub(crate) fn finish(child: &mut Child) -> bool {
    if !matches!(child.try_wait(), Ok(None)) {
        return true;
    }
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(120) {
        if let Ok(Some(_)) = child.try_wait() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(cmd: &[String]) -> serde_json::Value {
        let at = cmd.iter().position(|a| a == "--settings").expect("--settings");
        serde_json::from_str(&cmd[at + 1]).unwrap()
    }

    /// The sidecar reads exactly the paths given here and spells none of the run's files itself.
    #[test]
    fn the_sidecar_reads_the_run_paths_it_is_given_and_names_none() {
        let run = RunDir::new("/runs/r");
        let w = WandbConfig { project: String::from("p"), ..WandbConfig::default() };
        let rl = settings(&command(&run, &w, false));
        let paths = rl["paths"].as_object().unwrap();
        assert_eq!(paths["metrics"], serde_json::json!(run.metrics()));
        assert_eq!(paths["trainer_metrics"], serde_json::json!(run.trainer_metrics()));
        assert_eq!(paths["config"], serde_json::json!(run.config(ConfigPart::Rl)));
        assert_eq!(paths["traces"].as_str().unwrap().replace("{step}", "7"), run.traces(7).display().to_string());
        assert_eq!(
            paths["eval_traces"].as_str().unwrap().replace("{step}", "7"),
            run.eval_traces(7).display().to_string()
        );
        assert_eq!(rl["dir"], serde_json::json!(run.wandb()));
        let sft = settings(&command(&run, &w, true));
        assert_eq!(sft["paths"]["config"], serde_json::json!(run.config(ConfigPart::Sft)));

        let source = include_str!("../../../python/rl-env/src/rl_env/tracking.py");
        let read: std::collections::BTreeSet<&str> =
            source.split("paths[\"").skip(1).filter_map(|rest| rest.split_once('"').map(|(key, _)| key)).collect();
        let given: std::collections::BTreeSet<&str> = paths.keys().map(String::as_str).collect();
        assert_eq!(read, given, "the keys of `paths` the sidecar reads are the ones passed");
        let spelled = |p: std::path::PathBuf| p.file_name().unwrap().to_string_lossy().into_owned();
        for file in [
            spelled(run.metrics()),
            spelled(run.traces(1)),
            spelled(run.config(ConfigPart::Rl)),
            spelled(run.config(ConfigPart::Sft)),
        ] {
            let quoted = format!("\"{file}\"");
            assert!(!source.contains(&quoted), "tracking.py spells the run file {quoted}; take it from `paths`");
        }
        assert!(!source.contains("\"rollouts\"") && !source.contains("\"configs\"") && !source.contains("\"trainer\""));
        assert!(!source.contains("\"evals\""));
    }
}
