//! `docs/guide-environments.md` is a test: its files (fenced blocks with `file=PATH`) are written to
//! a fresh directory and its `sh` blocks run there in order, as a newcomer would run them (the
//! `rl rl` runs shortened to two steps). Then the runs it promises must exist.

use std::path::Path;
use std::process::Command;

use rl_run::{MetricsRow, read_jsonl};

use crate::root;

/// The guide's files `(path, text)` and shell commands, in order.
fn parse(guide: &str) -> (Vec<(String, String)>, Vec<String>) {
    let (mut files, mut commands) = (Vec::new(), Vec::new());
    let mut lines = guide.lines();
    while let Some(line) = lines.next() {
        let Some(info) = line.strip_prefix("```") else { continue };
        let body: Vec<&str> = lines.by_ref().take_while(|l| !l.starts_with("```")).collect();
        if let Some(path) = info.split_whitespace().find_map(|w| w.strip_prefix("file=")) {
            files.push((path.to_owned(), format!("{}\n", body.join("\n"))));
        } else if info.trim() == "sh" {
            commands.extend(body.iter().filter(|l| !l.trim().is_empty()).map(|l| (*l).to_owned()));
        }
    }
    (files, commands)
}

#[test]
fn the_environment_guide_runs_from_an_empty_directory() {
    let guide = std::fs::read_to_string(root().join("docs/guide-environments.md")).unwrap();
    let (files, commands) = parse(&guide);
    assert!(files.len() >= 5 && commands.len() >= 5, "the guide lost its blocks: {files:?} {commands:?}");
    // The default learning rate (1e-6) barely moves the guide's tiny model: its configs set one.
    for (path, text) in files.iter().filter(|(_, t)| t.contains("[[orchestrator.train.env]]")) {
        assert!(text.contains("[trainer.optim]\nlr = "), "{path} leaves the learning rate at its default");
    }
    // And `--help` says what the default is for.
    let rl = Path::new(env!("CARGO_BIN_EXE_rl"));
    let help = Command::new(rl).args(["rl", "--help", "trainer"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("barely moves a small"), "{help}");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // The repository's SDK, where the guide's `pip install -e python/rl-env` expects it.
    std::os::unix::fs::symlink(root().join("python"), dir.join("python")).unwrap();
    for (path, text) in &files {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    let rl_dir = Path::new(env!("CARGO_BIN_EXE_rl")).parent().unwrap();
    let path = format!("{}:{}", rl_dir.display(), std::env::var("PATH").unwrap_or_default());
    for command in &commands {
        let command = if command.starts_with("rl rl ") { format!("{command} --max-steps 2") } else { command.clone() };
        let out = Command::new("sh").args(["-c", &command]).current_dir(dir).env("PATH", &path).output().unwrap();
        assert!(
            out.status.success(),
            "`{command}` failed:\nstdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for (run, envs) in [("my-envs", &["arith", "lookup"][..]), ("my-math", &["math"][..])] {
        let rows: Vec<MetricsRow> = read_jsonl(&dir.join("outputs").join(run).join("metrics.jsonl")).unwrap();
        assert_eq!(rows.len(), 2, "{run}: a metrics row per step");
        for env in envs {
            let found = rows.iter().any(|r| r.keyed.keys().any(|k| k.contains(env)));
            assert!(found, "{run}: no metrics of env {env}: {:?}", rows[0].keyed.keys().collect::<Vec<_>>());
        }
    }
}
