//! The launcher end to end on a very small config: `rl model init`, then `rl rl` for 3 steps with
//! the embedded inference server, an env server, the trainer and the orchestrator as processes;
//! then `--resume` from the step-2 checkpoint; Ctrl-C stopping every process; and the children
//! exiting by themselves when the launcher is killed with SIGKILL.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rl_configs::RunDir;
use rl_configs::run_dir::{TrainerRow, read_jsonl};

use crate::{rl, root, stderr, stdout};

/// `rl rl` on the smoke config under `out` with the test's model, checkpointing every 2 steps.
fn smoke(out: &std::path::Path, model: &std::path::Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["rl", "@", "configs/ci/smoke.toml", "--output-dir", out.to_str().unwrap()];
    args.extend(["--model.path", model.to_str().unwrap(), "--ckpt.interval", "2"]);
    args.extend(extra);
    rl(&args)
}

#[test]
fn rl_runs_three_steps_across_all_processes() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny");
    assert!(rl(&["model", "init", "--out", model.to_str().unwrap(), "--seed", "2"]).status.success());
    // A dry run first: its resolved configs must not make the real run refuse the directory.
    assert!(smoke(tmp.path(), &model, &["--dry-run"]).status.success());
    let o = smoke(tmp.path(), &model, &[]);
    assert!(o.status.success(), "stdout:\n{}\nstderr:\n{}", stdout(&o), stderr(&o));
    let run = tmp.path().join("ci-smoke");
    for step in 1..=3 {
        assert!(run.join(format!("rollouts/step_{step}/rank_0.bin")).exists(), "batch for step {step}");
        assert!(run.join(format!("broadcasts/step_{step}/STABLE")).exists(), "weights after step {step}");
        assert!(stdout(&o).contains(&format!("step {step}/3 | reward")), "a progress line per step:\n{}", stdout(&o));
    }
    assert!(!stdout(&o).contains("NaN"), "progress lines show no NaN:\n{}", stdout(&o));
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 3, "rewards logged for every step");
    // A random model writes no tags, so every rollout is penalised by 0.3 * step / 3: the reward
    // reveals the training_context.step each env request carried.
    for (i, row) in rows.iter().enumerate() {
        let reward = row["reward/mean"].as_f64().unwrap();
        let full = -0.1 * (i + 1) as f64;
        assert!(
            reward <= 0.0 && reward >= full - 1e-9 && reward < full / 2.0,
            "step {}: reward {reward}, expected about {full}",
            i + 1
        );
    }
    assert!(rows[2]["policy_version"].as_u64().unwrap() >= 1, "the inference server was given newer weights");
    let inference_log = std::fs::read_to_string(run.join("logs/inference.log")).unwrap();
    assert!(inference_log.contains("weights updated"), "update_weights reached the inference server");
    assert!(!inference_log.contains('\u{1b}'), "log files are plain text, without colour codes");
    assert!(run.join("trainer/metrics.jsonl").exists());
    let final_model = run.join("model");
    assert!(stdout(&o).contains("final model (after step 3)"), "{}", stdout(&o));
    rl_model::load_model(&final_model, &candle_core::Device::Cpu).expect("the final model directory loads");
    let svg = std::fs::read_to_string(run.join("curves.svg")).expect("the run draws its curves");
    assert!(svg.starts_with("<svg") && svg.contains("reward") && svg.contains("mismatch KL"));

    // Both processes checkpointed step 2 (the interval) and step 3 (the last step). Resume from
    // step 2, as after a crash during step 3, and go on to step 4.
    let dir = RunDir::new(&run);
    for step in [2, 3] {
        assert!(dir.trainer_checkpoint_marker(step).exists() && dir.orchestrator_state(step).exists(), "step {step}");
    }
    let o = smoke(tmp.path(), &model, &["--max-steps", "4", "--resume.step", "2"]);
    assert!(o.status.success(), "stdout:\n{}\nstderr:\n{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("from checkpoint step 2"), "{}", stdout(&o));
    assert!(stdout(&o).contains("step 3/4 | reward") && stdout(&o).contains("step 4/4 | reward"), "{}", stdout(&o));
    assert!(!stdout(&o).contains("step 2/4"), "steps up to the checkpoint are not rerun: {}", stdout(&o));
    let steps: Vec<u64> = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, vec![1, 2, 3, 4], "the resumed run replaced steps after the checkpoint");
    let trainer_steps: Vec<u64> =
        read_jsonl::<TrainerRow>(&dir.trainer_metrics()).unwrap().iter().map(|r| r.step).collect();
    assert_eq!(trainer_steps, vec![1, 2, 3, 4], "the trainer's rows of retrained steps are replaced, not repeated");
    assert!(stdout(&o).contains("final model (after step 4)"), "{}", stdout(&o));
}

/// Processes whose command line names `path` (from /proc: no pgrep needed).
fn pids_naming(path: &std::path::Path) -> Vec<String> {
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

#[test]
fn children_exit_when_the_launcher_is_killed() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny");
    assert!(rl(&["model", "init", "--out", model.to_str().unwrap(), "--seed", "3"]).status.success());
    let mut child = Command::new(env!("CARGO_BIN_EXE_rl"))
        .args(["rl", "@", "configs/ci/smoke.toml", "--max-steps", "1000", "--run.name", "killed"])
        .args(["--output-dir", tmp.path().to_str().unwrap(), "--model.path", model.to_str().unwrap()])
        .current_dir(root())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(lines.next().unwrap().unwrap().starts_with("step 1/1000"));
    let configs = tmp.path().join("killed").join("configs");
    assert!(!pids_naming(&configs).is_empty(), "the children run");
    // SIGKILL: the launcher cannot stop anyone; its children must notice on their own.
    child.kill().unwrap();
    child.wait().unwrap();
    let start = Instant::now();
    while !pids_naming(&configs).is_empty() {
        assert!(start.elapsed() < Duration::from_secs(20), "children outlived the killed launcher");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn ctrl_c_stops_every_process_and_exits_non_zero() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny");
    assert!(rl(&["model", "init", "--out", model.to_str().unwrap(), "--seed", "3"]).status.success());
    let mut child = Command::new(env!("CARGO_BIN_EXE_rl"))
        .args(["rl", "@", "configs/ci/smoke.toml", "--max-steps", "1000", "--run.name", "interrupted"])
        .args(["--output-dir", tmp.path().to_str().unwrap(), "--model.path", model.to_str().unwrap()])
        .current_dir(root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.starts_with("step 1/1000"), "{first}");
    let run = tmp.path().join("interrupted");
    let pids = |name: &str| pids_naming(&run.join("configs").join(name));
    assert_eq!(pids("trainer.json").len(), 1, "the trainer runs");
    assert!(Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap().success());
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "the launcher did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("interrupted"), "{err}");
    for name in ["trainer.json", "orchestrator.json", "inference.json", "envs/train/reverse-text.json"] {
        assert!(pids(name).is_empty(), "{name}: its process outlived the launcher");
    }
}

/// A stopped trainer (SIGSTOP) does not freeze the run silently: past `launcher.stall_timeout_s` the
/// launcher stops it, naming the stopped child and showing its log, and no child survives.
#[test]
fn a_stalled_run_is_stopped_naming_the_child_that_stopped() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny");
    assert!(rl(&["model", "init", "--out", model.to_str().unwrap(), "--seed", "3"]).status.success());
    let mut child = Command::new(env!("CARGO_BIN_EXE_rl"))
        .args(["rl", "@", "configs/ci/smoke.toml", "--max-steps", "1000", "--run.name", "stalled"])
        .args(["--output-dir", tmp.path().to_str().unwrap(), "--model.path", model.to_str().unwrap()])
        .args(["--launcher.stall-timeout-s", "4"])
        .current_dir(root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(lines.next().unwrap().unwrap().starts_with("step 1/1000"));
    let configs = tmp.path().join("stalled").join("configs");
    let trainer = pids_naming(&configs.join("trainer.json"));
    assert_eq!(trainer.len(), 1);
    assert!(Command::new("kill").args(["-STOP", &trainer[0]]).status().unwrap().success());
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(start.elapsed() < Duration::from_secs(90), "the stalled run was not stopped");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(!status.success());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("launcher.stall_timeout_s"), "{err}");
    assert!(err.contains(&format!("trainer (pid {}): STOPPED", trainer[0])), "{err}");
    assert!(err.contains("inference /health: ok"), "{err}");
    assert!(err.contains("last lines of") && err.contains("trainer.log"), "{err}");
    assert!(pids_naming(&configs).is_empty(), "every child was stopped");
}

/// With `inference.api_key_env` and `admin_key_env` set, the launcher hands the key names to the
/// orchestrator; rollouts (env server -> inference, the key travelling in each request), weight
/// updates (admin key) and env-server calls (`serve.token_env`) go through, and the run finishes. Without the variables it fails at once,
/// naming them.
#[test]
fn a_run_with_api_admin_and_env_keys_finishes() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny");
    assert!(rl(&["model", "init", "--out", model.to_str().unwrap(), "--seed", "3"]).status.success());
    let run = |with_keys: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_rl"));
        cmd.args(["rl", "@", "configs/ci/smoke.toml", "--max-steps", "2", "--run.name", "keyed", "--clean"])
            .args(["--output-dir", tmp.path().to_str().unwrap(), "--model.path", model.to_str().unwrap()])
            .args(["--inference.api-key-env", "RL_TEST_API_KEY", "--inference.admin-key-env", "RL_TEST_ADMIN_KEY"])
            .args(["--orchestrator.train.env.0.serve.token-env", "RL_TEST_ENV_TOKEN"])
            .current_dir(root());
        if with_keys {
            cmd.env("RL_TEST_API_KEY", "k-api").env("RL_TEST_ADMIN_KEY", "k-admin").env("RL_TEST_ENV_TOKEN", "k-env");
        }
        cmd.output().unwrap()
    };
    let o = run(true);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("step 2/2"), "{}", stdout(&o));
    let o = run(false);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("RL_TEST_API_KEY"), "{}", stderr(&o));
}

/// `kill -9` of the env server mid-run: the launcher restarts it on its address, the orchestrator
/// reconnects (groups that failed meanwhile are run again or dropped) and the run finishes.
#[test]
fn a_killed_env_server_is_restarted_and_the_run_finishes() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny");
    assert!(rl(&["model", "init", "--out", model.to_str().unwrap(), "--seed", "3"]).status.success());
    let mut child = Command::new(env!("CARGO_BIN_EXE_rl"))
        .args(["rl", "@", "configs/ci/smoke.toml", "--max-steps", "30", "--run.name", "restarted"])
        .args(["--output-dir", tmp.path().to_str().unwrap(), "--model.path", model.to_str().unwrap()])
        .current_dir(root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(lines.next().unwrap().unwrap().starts_with("step 1/30"));
    let env_cfg = tmp.path().join("restarted/configs/envs/train/reverse-text.json");
    let env = pids_naming(&env_cfg);
    assert_eq!(env.len(), 1);
    assert!(Command::new("kill").args(["-KILL", &env[0]]).status().unwrap().success());
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{}\n{err}", rest.join("\n"));
    assert!(
        rest.iter().any(|l| l.contains("env-reverse-text exited with") && l.contains("restarting it (1/3)")),
        "{rest:?}"
    );
    assert!(rest.iter().any(|l| l.starts_with("step 30/30")), "{rest:?}");
    let again = pids_naming(&env_cfg);
    assert!(again.is_empty(), "the restarted server was stopped at the end: {again:?}");
}

/// `kill -9` of the inference server mid-run: the launcher restarts it on its port, the
/// orchestrator sees its new boot id and loads the policy's current weights into it again, and the
/// run finishes.
#[test]
fn a_killed_inference_server_is_restarted_with_the_current_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny");
    assert!(rl(&["model", "init", "--out", model.to_str().unwrap(), "--seed", "3"]).status.success());
    let mut child = Command::new(env!("CARGO_BIN_EXE_rl"))
        .args(["rl", "@", "configs/ci/smoke.toml", "--max-steps", "30", "--run.name", "reinference"])
        .args(["--output-dir", tmp.path().to_str().unwrap(), "--model.path", model.to_str().unwrap()])
        .current_dir(root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for _ in 0..3 {
        assert!(lines.next().unwrap().unwrap().starts_with("step "));
    }
    let run = tmp.path().join("reinference");
    let inference = pids_naming(&run.join("configs/inference.json"));
    assert_eq!(inference.len(), 1);
    assert!(Command::new("kill").args(["-KILL", &inference[0]]).status().unwrap().success());
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{}\n{err}", rest.join("\n"));
    assert!(
        rest.iter().any(|l| l.starts_with("inference exited with") && l.contains("restarting it (1/3)")),
        "{rest:?}"
    );
    assert!(rest.iter().any(|l| l.starts_with("step 30/30")), "{rest:?}");
    let log = std::fs::read_to_string(run.join("logs/orchestrator.log")).unwrap();
    assert!(log.contains("restarted; loading its weights again"), "{log}");
}

/// Crash at arbitrary points, then `--resume`: every process of the run is killed with SIGKILL at
/// once at several moments (mid-step, so between a batch write and the trainer's read, during a
/// broadcast or a checkpoint, whichever is under way), and after `--resume` every JSONL file holds
/// each step exactly once, in order, and the run ends with its final model.
#[test]
fn after_a_crash_anywhere_resume_leaves_each_step_once_in_every_file() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny");
    assert!(rl(&["model", "init", "--out", model.to_str().unwrap(), "--seed", "4"]).status.success());
    for (kill_after, delay_ms) in [(2u64, 0u64), (5, 37), (8, 113)] {
        let name = format!("crash-{kill_after}");
        let base = ["rl", "@", "configs/ci/smoke.toml", "--max-steps", "12", "--ckpt.interval", "2"];
        let mut child = Command::new(env!("CARGO_BIN_EXE_rl"))
            .args(base)
            .args(["--run.name", &name, "--output-dir", tmp.path().to_str().unwrap()])
            .args(["--model.path", model.to_str().unwrap()])
            .current_dir(root())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let wanted = format!("step {kill_after}/12");
        assert!(lines.any(|l| l.is_ok_and(|l| l.starts_with(&wanted))), "{name}: never reached {wanted}");
        std::thread::sleep(Duration::from_millis(delay_ms));
        let run = tmp.path().join(&name);
        let mut victims = pids_naming(&run.join("configs"));
        victims.push(child.id().to_string());
        assert!(Command::new("kill").arg("-KILL").args(&victims).status().unwrap().success());
        child.wait().unwrap();
        let start = Instant::now();
        while !pids_naming(&run.join("configs")).is_empty() {
            assert!(start.elapsed() < Duration::from_secs(20));
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut args = base.to_vec();
        args.extend(["--run.name", &name, "--output-dir", tmp.path().to_str().unwrap()]);
        args.extend(["--model.path", model.to_str().unwrap(), "--resume"]);
        let o = rl(&args);
        assert!(o.status.success(), "{name}: {}\n{}", stdout(&o), stderr(&o));
        let dir = RunDir::new(&run);
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
    let model = tmp.path().join("tiny");
    assert!(rl(&["model", "init", "--out", model.to_str().unwrap(), "--seed", "3"]).status.success());
    let wandb = r#"{"project": "p", "mode": "offline", "python": ["false"]}"#;
    let o = smoke(tmp.path(), &model, &["--wandb", wandb, "--tensorboard", "{}"]);
    assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
    assert_eq!(stdout(&o).matches("warning: wandb exited with").count(), 1, "{}", stdout(&o));
    assert!(stdout(&o).contains("step 3/3"), "{}", stdout(&o));
    // `[tensorboard]` in the same run: one event file holding the steps' scalars.
    let events: Vec<_> = std::fs::read_dir(tmp.path().join("ci-smoke/tensorboard")).unwrap().flatten().collect();
    assert_eq!(events.len(), 1);
    let bytes = std::fs::read(events[0].path()).unwrap();
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.contains("reward/mean") && text.contains("trainer/loss"), "scalar tags are in the event file");
}
