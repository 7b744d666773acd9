//! `rl rl` when things go wrong: signals to the launcher (SIGINT, SIGKILL), a stopped trainer, a
//! killed env or inference server, every process killed at once then `--resume`, API keys, and a
//! failing tracking sidecar. Each test launches the smoke config in the background and acts on its
//! processes, found by the config files on their command lines.

use std::io::{BufRead, BufReader, Lines};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use rl_run::RunDir;
use rl_run::{TrainerRow, read_jsonl};

use crate::e2e::smoke;
use crate::{rl, root, stderr, stdout};

/// A random tiny model in `dir`.
fn tiny_model(dir: &Path, seed: &str) -> PathBuf {
    let model = dir.join("tiny");
    assert!(rl(&["model", "init", "--out", model.to_str().unwrap(), "--seed", seed]).status.success());
    model
}

/// `rl rl` on the smoke config as run `name` under `dir`, in the background; its stdout lines.
fn launch(dir: &Path, model: &Path, name: &str, extra: &[&str]) -> (Child, Lines<BufReader<ChildStdout>>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rl"))
        .args(["rl", "@", "configs/ci/smoke.toml", "--run.name", name])
        .args(["--output-dir", dir.to_str().unwrap(), "--model.path", model.to_str().unwrap()])
        .args(extra)
        .current_dir(root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    (child, lines)
}

/// The next step line, past the launcher's warnings: the tiny random model's rewards are all
/// equal, so its steps train nothing, and the launcher says so between step lines.
fn next_step_line(lines: &mut Lines<BufReader<ChildStdout>>) -> String {
    loop {
        let line = lines.next().unwrap().unwrap();
        if line.starts_with("step ") {
            return line;
        }
        assert!(line.starts_with("warning: "), "unexpected line {line:?}");
    }
}

/// Waits for `child` to exit, at most `limit`.
fn exit_within(child: &mut Child, limit: Duration, what: &str) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(start.elapsed() < limit, "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// All `child` wrote to stderr (after it exited).
fn stderr_of(child: &mut Child) -> String {
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    err
}

/// Processes whose command line names `path` (from /proc: no pgrep needed).
fn pids_naming(path: &Path) -> Vec<String> {
    let needle = path.display().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
        .filter(|e| {
            std::fs::read(e.path().join("cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains(&needle))
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Sends `signal` (`-KILL`, `-STOP`, ...) to `pids`.
fn signal(signal: &str, pids: &[String]) {
    assert!(Command::new("kill").arg(signal).args(pids).status().unwrap().success());
}

/// Waits until no process names `path` any more, at most `limit`.
fn gone_within(path: &Path, limit: Duration, what: &str) {
    let start = Instant::now();
    while !pids_naming(path).is_empty() {
        assert!(start.elapsed() < limit, "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn children_exit_when_the_launcher_is_killed() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path(), "3");
    let (mut child, mut lines) = launch(tmp.path(), &model, "killed", &["--max-steps", "1000"]);
    assert!(next_step_line(&mut lines).starts_with("step 1/1000"));
    let configs = tmp.path().join("killed/configs");
    assert!(!pids_naming(&configs).is_empty(), "the children run");
    // SIGKILL: the launcher cannot stop anyone; its children must notice on their own.
    child.kill().unwrap();
    child.wait().unwrap();
    gone_within(&configs, Duration::from_secs(20), "children outlived the killed launcher");
}

#[test]
fn ctrl_c_stops_every_process_and_exits_non_zero() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path(), "3");
    let (mut child, mut lines) = launch(tmp.path(), &model, "interrupted", &["--max-steps", "1000"]);
    let first = next_step_line(&mut lines);
    assert!(first.starts_with("step 1/1000"), "{first}");
    let configs = tmp.path().join("interrupted/configs");
    assert_eq!(pids_naming(&configs.join("trainer.json")).len(), 1, "the trainer runs");
    signal("-INT", &[child.id().to_string()]);
    let status = exit_within(&mut child, Duration::from_secs(60), "the launcher did not stop");
    assert!(!status.success());
    let err = stderr_of(&mut child);
    assert!(err.contains("interrupted"), "{err}");
    for name in ["trainer.json", "orchestrator.json", "inference.json", "envs/train/reverse-text.json"] {
        assert!(pids_naming(&configs.join(name)).is_empty(), "{name}: its process outlived the launcher");
    }
}

/// A stopped trainer (SIGSTOP) does not freeze the run silently: past `launcher.stall_timeout_s`
/// the launcher stops it, naming the stopped child and showing its log, and no child survives.
#[test]
fn a_stalled_run_is_stopped_naming_the_child_that_stopped() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path(), "3");
    let extra = ["--max-steps", "1000", "--launcher.stall-timeout-s", "4"];
    let (mut child, mut lines) = launch(tmp.path(), &model, "stalled", &extra);
    assert!(next_step_line(&mut lines).starts_with("step 1/1000"));
    let configs = tmp.path().join("stalled/configs");
    let trainer = pids_naming(&configs.join("trainer.json"));
    assert_eq!(trainer.len(), 1);
    signal("-STOP", &trainer);
    let status = exit_within(&mut child, Duration::from_secs(90), "the stalled run was not stopped");
    assert!(!status.success());
    let err = stderr_of(&mut child);
    assert!(err.contains("launcher.stall_timeout_s"), "{err}");
    assert!(err.contains(&format!("trainer (pid {}): STOPPED", trainer[0])), "{err}");
    assert!(err.contains("inference /health: ok"), "{err}");
    assert!(err.contains("last lines of") && err.contains("trainer.log"), "{err}");
    assert!(pids_naming(&configs).is_empty(), "every child was stopped");
}

/// With `inference.api_key_env` and `admin_key_env` set, the launcher hands the key names to the
/// orchestrator; rollouts (env server -> inference, the key travelling in each request), weight
/// updates (admin key) and env-server calls (`serve.token_env`) go through, and the run finishes.
/// Without the variables it fails at once, naming them; with them in the config's `[env_vars]`
/// instead of the launcher's environment, every child gets them and the run finishes.
#[test]
fn a_run_with_api_admin_and_env_keys_finishes() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path(), "3");
    let run = |keys: &str| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_rl"));
        cmd.args(["rl", "@", "configs/ci/smoke.toml", "--max-steps", "2", "--run.name", "keyed", "--clean"])
            .args(["--output-dir", tmp.path().to_str().unwrap(), "--model.path", model.to_str().unwrap()])
            .args(["--inference.api-key-env", "RL_TEST_API_KEY", "--inference.admin-key-env", "RL_TEST_ADMIN_KEY"])
            .args(["--orchestrator.train.env.0.serve.token-env", "RL_TEST_ENV_TOKEN"])
            .current_dir(root());
        let vars = [("RL_TEST_API_KEY", "k-api"), ("RL_TEST_ADMIN_KEY", "k-admin"), ("RL_TEST_ENV_TOKEN", "k-env")];
        match keys {
            "environment" => {
                cmd.envs(vars);
            }
            "env_vars" => {
                let table: serde_json::Map<String, serde_json::Value> =
                    vars.iter().map(|(k, v)| ((*k).to_owned(), serde_json::json!(v))).collect();
                cmd.args(["--env-vars", &serde_json::Value::Object(table).to_string()]);
            }
            _ => {}
        }
        cmd.output().unwrap()
    };
    for keys in ["environment", "env_vars"] {
        let o = run(keys);
        assert!(o.status.success(), "{keys}: {}", stderr(&o));
        assert!(stdout(&o).contains("step 2/2"), "{keys}: {}", stdout(&o));
    }
    let o = run("none");
    assert!(!o.status.success());
    assert!(stderr(&o).contains("RL_TEST_API_KEY"), "{}", stderr(&o));
}

/// `kill -9` of one server mid-run (after `after` steps), the run under `dir`: the launcher
/// restarts it on its port, the run finishes all 30 steps, and the restarted process is stopped at
/// the end. Returns the lines printed after the kill and the run's directory.
fn kill_a_server_mid_run(dir: &Path, name: &str, config: &str, after: usize) -> (Vec<String>, PathBuf) {
    let model = tiny_model(dir, "3");
    let (mut child, mut lines) = launch(dir, &model, name, &["--max-steps", "30"]);
    for _ in 0..after {
        next_step_line(&mut lines);
    }
    let run = dir.join(name);
    let server = pids_naming(&run.join("configs").join(config));
    assert_eq!(server.len(), 1);
    signal("-KILL", &server);
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = child.wait().unwrap();
    assert!(status.success(), "{}\n{}", rest.join("\n"), stderr_of(&mut child));
    assert!(rest.iter().any(|l| l.contains("restarting it (1/3)")), "{rest:?}");
    assert!(rest.iter().any(|l| l.starts_with("step 30/30")), "{rest:?}");
    assert!(pids_naming(&run.join("configs").join(config)).is_empty(), "the restarted server was stopped at the end");
    (rest, run)
}

/// `kill -9` of the env server mid-run: restarted on its address, the orchestrator reconnects
/// (groups that failed meanwhile are run again or dropped) and the run finishes.
#[test]
fn a_killed_env_server_is_restarted_and_the_run_finishes() {
    let tmp = tempfile::tempdir().unwrap();
    let (rest, _) = kill_a_server_mid_run(tmp.path(), "restarted", "envs/train/reverse-text.json", 1);
    assert!(rest.iter().any(|l| l.starts_with("env-reverse-text exited with")), "{rest:?}");
}

/// `kill -9` of the inference server mid-run: restarted on its port, the orchestrator sees its new
/// boot id and loads the policy's current weights into it again, and the run finishes.
#[test]
fn a_killed_inference_server_is_restarted_with_the_current_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let (rest, run) = kill_a_server_mid_run(tmp.path(), "reinference", "inference.json", 3);
    assert!(rest.iter().any(|l| l.starts_with("inference exited with")), "{rest:?}");
    let log = std::fs::read_to_string(run.join("logs/orchestrator.log")).unwrap();
    assert!(log.contains("restarted or came back; loading its weights again"), "{log}");
}

/// Crash at arbitrary points, then `--resume`: every process of the run is killed with SIGKILL at
/// once at several moments (mid-step, so between a batch write and the trainer's read, during a
/// broadcast or a checkpoint, whichever is under way), and after `--resume` every JSONL file holds
/// each step exactly once, in order, and the run ends with its final model. Each kill waits for
/// the first complete checkpoint too: the step line can come before the trainer has written it (a
/// run stopped before its first cannot resume, and says so: `finish::resume_step`).
#[test]
fn after_a_crash_anywhere_resume_leaves_each_step_once_in_every_file() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path(), "4");
    let steps = ["--max-steps", "12", "--ckpt.interval", "2"];
    for (kill_after, delay_ms) in [(2u64, 0u64), (5, 37), (8, 113)] {
        let name = format!("crash-{kill_after}");
        let (mut child, mut lines) = launch(tmp.path(), &model, &name, &steps);
        let wanted = format!("step {kill_after}/12");
        assert!(lines.any(|l| l.is_ok_and(|l| l.starts_with(&wanted))), "{name}: never reached {wanted}");
        let dir = RunDir::new(tmp.path().join(&name));
        let start = Instant::now();
        while dir.complete_checkpoints().is_empty() {
            assert!(start.elapsed() < Duration::from_secs(60), "{name}: no complete checkpoint within 60 s");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(delay_ms));
        let configs = tmp.path().join(&name).join("configs");
        let mut victims = pids_naming(&configs);
        victims.push(child.id().to_string());
        signal("-KILL", &victims);
        child.wait().unwrap();
        gone_within(&configs, Duration::from_secs(20), "killed processes linger");
        let mut args = vec!["rl", "@", "configs/ci/smoke.toml", "--run.name", &name, "--resume"];
        args.extend(steps);
        args.extend(["--output-dir", tmp.path().to_str().unwrap(), "--model.path", model.to_str().unwrap()]);
        if kill_after == 2 {
            // A crash in the middle of appending a row: the resume cuts it and says so.
            let mut metrics = std::fs::OpenOptions::new().append(true).open(dir.metrics()).unwrap();
            std::io::Write::write_all(&mut metrics, b"{\"step\": 99, \"rew").unwrap();
        }
        let o = rl(&args);
        assert!(o.status.success(), "{name}: {}\n{}", stdout(&o), stderr(&o));
        if kill_after == 2 {
            assert!(stderr(&o).contains("cut a torn last line"), "{name}: {}", stderr(&o));
        }
        let orch: Vec<u64> = read_jsonl::<serde_json::Value>(&dir.metrics())
            .unwrap()
            .iter()
            .map(|r| r["step"].as_u64().unwrap())
            .collect();
        let trainer: Vec<u64> =
            read_jsonl::<TrainerRow>(&dir.trainer_metrics()).unwrap().iter().map(|r| r.step).collect();
        let all: Vec<u64> = (1..=12).collect();
        assert_eq!(orch, all, "{name}: orchestrator metrics");
        assert_eq!(trainer, all, "{name}: trainer metrics");
        assert!(stdout(&o).contains("final model (after step 12)"), "{name}: {}", stdout(&o));
    }
}

/// The W&B sidecar is best effort: when it cannot run (here its interpreter exits at once), the
/// launcher says so once, with its log, and the run finishes; `[tensorboard]` writes event files.
#[test]
fn a_failing_tracking_sidecar_is_reported_and_tensorboard_files_are_written() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path(), "3");
    let wandb = r#"{"project": "p", "mode": "offline", "python": ["false"]}"#;
    let o = smoke(tmp.path(), &model, &["--wandb", wandb, "--tensorboard", "{}"]);
    assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
    assert_eq!(stdout(&o).matches("warning: wandb exited with").count(), 1, "{}", stdout(&o));
    assert!(stdout(&o).contains("step 3/3"), "{}", stdout(&o));
    // `[tensorboard]` in the same run: one event file holding the steps' scalars.
    let events: Vec<_> = std::fs::read_dir(tmp.path().join("ci-smoke/tensorboard")).unwrap().flatten().collect();
    assert_eq!(events.len(), 1);
    let text = String::from_utf8_lossy(&std::fs::read(events[0].path()).unwrap()).into_owned();
    assert!(text.contains("reward/mean") && text.contains("trainer/loss"), "scalar tags are in the event file");
}

/// With the restart budget spent (here 0), a crashed env server ends the run, and the error says
/// the budget is why.
#[test]
fn a_spent_restart_budget_ends_the_run_saying_so() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path(), "3");
    let extra = ["--max-steps", "1000", "--launcher.max-restarts", "0"];
    let (mut child, mut lines) = launch(tmp.path(), &model, "budget", &extra);
    assert!(next_step_line(&mut lines).starts_with("step 1/1000"));
    signal("-KILL", &pids_naming(&tmp.path().join("budget/configs/envs/train/reverse-text.json")));
    let status = exit_within(&mut child, Duration::from_secs(60), "the run did not stop");
    assert!(!status.success());
    let err = stderr_of(&mut child);
    assert!(err.contains("env-reverse-text exited with") && err.contains("launcher.max_restarts spent"), "{err}");
}

/// Ctrl-C on `rl sft`: the step under way finishes, is checkpointed and written as the model, the
/// command exits non-zero saying how to continue, and `--resume` goes on from that step.
#[test]
fn ctrl_c_stops_sft_after_a_checkpointed_step_and_resume_continues() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path(), "5");
    let args = |extra: &[&str]| {
        let mut a = vec!["sft", "@", "configs/reverse_text/sft.toml", "--output-dir", tmp.path().to_str().unwrap()];
        a.extend(["--model.path", model.to_str().unwrap(), "--max-steps", "100000", "--batch-size", "2"]);
        a.extend(["--ckpt.interval", "100000", "--scheduler.warmup-steps", "1"]);
        a.extend(extra);
        a.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_rl"))
        .args(args(&[]))
        .current_dir(root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    while !lines.next().unwrap().unwrap().starts_with("step 2/") {}
    signal("-INT", &[child.id().to_string()]);
    let status = exit_within(&mut child, Duration::from_secs(60), "rl sft did not stop");
    assert!(!status.success());
    let err = stderr_of(&mut child);
    assert!(err.contains("interrupted after step") && err.contains("--resume"), "{err}");
    let run = RunDir::new(tmp.path().join("reverse-text-sft"));
    let step = run.checkpoint_steps().into_iter().max().expect("the interrupted step was checkpointed");
    assert!(step >= 2 && err.contains(&format!("step {step}/")), "{err}");
    rl_model::load_model(&run.model(), &candle_core::Device::Cpu).expect("the model of that step is written");
    let o = Command::new(env!("CARGO_BIN_EXE_rl"))
        .args(args(&["--resume", "--max-steps", &(step + 1).to_string()]))
        .current_dir(root())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains(&format!("step {}/{}", step + 1, step + 1)), "{}", stdout(&o));
}

/// Two embedded inference servers (`launcher.inference_servers = 2`), one killed with `kill -9`
/// mid-run: groups go to both, the dead one is taken out of service (its groups run again on the
/// other), restarted, given the current weights, and the run finishes with every step.
#[test]
fn two_inference_servers_share_the_groups_and_one_killed_mid_run_costs_no_step() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path(), "4");
    let (mut child, mut lines) =
        launch(tmp.path(), &model, "replicas", &["--max-steps", "30", "--launcher.inference-servers", "2"]);
    for _ in 0..3 {
        next_step_line(&mut lines);
    }
    let run = tmp.path().join("replicas");
    let servers = pids_naming(&run.join("configs/inference.json"));
    assert_eq!(servers.len(), 2, "{servers:?}");
    signal("-KILL", &servers[..1]);
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = child.wait().unwrap();
    assert!(status.success(), "{}\n{}", rest.join("\n"), stderr_of(&mut child));
    assert!(rest.iter().any(|l| l.contains("exited with") && l.contains("restarting it (1/3)")), "{rest:?}");
    assert!(rest.iter().any(|l| l.starts_with("step 30/30")), "{rest:?}");
    let rows: Vec<serde_json::Value> = read_jsonl(&RunDir::new(&run).metrics()).unwrap();
    let steps: Vec<u64> = rows.iter().filter_map(|r| r["step"].as_u64()).collect();
    assert_eq!(steps, (1..=30).collect::<Vec<_>>(), "every step once");
    for i in 0..2 {
        let groups: u64 = rows.iter().filter_map(|r| r[format!("inference/{i}/groups")].as_u64()).sum();
        assert!(groups > 0, "server {i} got no group: {rows:?}");
    }
    let last = rows.last().unwrap();
    assert_eq!((last["inference/0/in_service"].as_u64(), last["inference/1/in_service"].as_u64()), (Some(1), Some(1)));
    assert!(pids_naming(&run.join("configs/inference.json")).is_empty(), "both servers were stopped at the end");
    let log = std::fs::read_to_string(run.join("logs/orchestrator.log")).unwrap();
    assert!(log.contains("came back; loading its weights again"), "{log}");
}

/// A policy served elsewhere that does not answer: the console says so at once (the wait itself
/// is the orchestrator's, in its log), and when the wait runs out the run fails naming the URL.
#[test]
fn a_policy_server_that_does_not_answer_is_said_on_the_console() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path(), "9");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let config = tmp.path().join("external.toml");
    let url = format!("http://{closed}/v1");
    let text = format!(
        "max_steps = 2\nseq_len = 256\n[orchestrator]\nbatch_size = 4\ngroup_size = 2\nwait_for_ready_s = 2\n\
         [orchestrator.model]\nbase_url = \"{url}\"\n[[orchestrator.train.env]]\nid = \"reverse-text\"\n\
         args = {{ num_examples = 20 }}\n"
    );
    std::fs::write(&config, text).unwrap();
    let o = crate::rl(&[
        "rl",
        "@",
        config.to_str().unwrap(),
        "--output-dir",
        tmp.path().to_str().unwrap(),
        "--model.path",
        model.to_str().unwrap(),
    ]);
    let (out, err) = (crate::stdout(&o), crate::stderr(&o));
    assert!(!o.status.success(), "{out}\n{err}");
    assert!(out.contains(&format!("the policy server at {url} does not answer yet")), "{out}");
    assert!(err.contains("not healthy after 2s"), "{err}");
}
