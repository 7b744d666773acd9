//! `rl eval` needs only a policy endpoint: it takes the served model's name from the server,
//! spawns the env servers of its `[[eval.env]]` entries itself, stops them when it ends, and fails
//! at once, naming the server and its log, when one of them exits.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::{rl, root, stderr, stdout};

/// `rl inference` on port 0 and its base URL (stopped when the guard drops).
struct Policy(Child);

impl Policy {
    fn start(model: &Path) -> (Self, String) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_rl"))
            .args(["inference", "--model.path", model.to_str().unwrap(), "--port", "0"])
            .current_dir(root())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let event: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad line {line:?}: {e}"));
        let url = event["base_url"].as_str().unwrap().to_owned();
        (Policy(child), url)
    }
}

impl Drop for Policy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Processes whose command line mentions `dir` (the spawned env servers' config paths do).
fn processes_under(dir: &Path) -> Vec<String> {
    let needle = dir.to_str().unwrap();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(needle))
        .collect()
}

#[test]
fn eval_spawns_its_env_servers_stops_them_and_names_one_that_exits() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny");
    assert!(rl(&["model", "init", "--out", model.to_str().unwrap(), "--seed", "1"]).status.success());
    let (_policy, url) = Policy::start(&model);
    let out = tmp.path().join("eval");
    let envs = r#"[{"id": "reverse-text", "args": {"num_examples": 8}}, {"id": "reverse-text", "name": "short", "args": {"num_examples": 8, "min_len": 3, "max_len": 4}}]"#;
    let args = ["eval", "--model.base-url", &url, "--output-dir", out.to_str().unwrap(), "--eval.num-examples", "4"];
    let o = rl(&[&args[..], &["--eval.env", envs]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("reverse-text | ") && text.contains("short | "), "{text}");
    let result: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("eval.json")).unwrap()).unwrap();
    assert_eq!(result["eval/reverse-text/examples"], 4, "{result}");
    assert_eq!(result["eval/short/examples"], 4, "{result}");
    assert!(out.join("logs/env-eval-short.log").exists());
    assert_eq!(processes_under(&out), Vec::<String>::new(), "env servers left running");

    // A name the server does not serve stops the start, naming the one it does.
    let o = rl(&[&args[..], &["--model.name", "nope", "--eval.env", envs]].concat());
    let err = stderr(&o);
    assert!(!o.status.success() && err.contains("does not serve `nope` (it serves `tiny`)"), "{err}");

    // A server that reports its address and then dies: named with its log, in seconds.
    let script = tmp.path().join("dying.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\necho '{\"address\": \"127.0.0.1:9\"}'\necho 'fake env: out of memory' >&2\nexit 3\n",
    )
    .unwrap();
    assert!(Command::new("chmod").arg("+x").arg(&script).status().unwrap().success());
    let dying = format!(r#"[{{"id": "fake", "command": ["{}"]}}]"#, script.display());
    let started = std::time::Instant::now();
    let o = rl(&[&args[..], &["--eval.env", &dying]].concat());
    let err = stderr(&o);
    assert!(
        !o.status.success() && err.contains("env-eval-fake exited") && err.contains("fake env: out of memory"),
        "{err}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(60), "took {:?}", started.elapsed());
}
