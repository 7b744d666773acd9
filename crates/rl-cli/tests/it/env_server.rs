//! `rl env-server` as a process: binds port 0, reports its address on one stdout line, serves,
//! and exits cleanly on SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rl_serve::{ClientOptions, EnvClient};

use crate::root;

/// Starts `rl env-server` and returns it with the address from its `listening` line.
fn start() -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rl"))
        .args(["env-server", "--env.id", "reverse-text", "--env.args.num-examples", "12", "--log.level", "warn"])
        .current_dir(root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let event: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad line {line:?}: {e}"));
    assert_eq!(event["event"], "listening");
    let address = event["address"].as_str().unwrap().to_owned();
    assert!(address.starts_with("127.0.0.1:") && !address.ends_with(":0"), "{address}");
    (child, address)
}

/// Sends SIGTERM and asserts the server exits by itself with status 0 (not killed by the signal).
fn terminate_and_expect_a_clean_exit(mut child: Child) {
    let pid = child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "env server did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "clean exit on SIGTERM: {status}");
}

#[test]
fn serves_on_a_reported_port_and_stops_on_sigterm() {
    let (child, address) = start();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let info = rt.block_on(async {
        let client = EnvClient::new(&address, ClientOptions::default()).unwrap();
        client.wait_for_health(Duration::from_secs(10)).await.unwrap();
        client.info().await.unwrap()
    });
    assert_eq!(info.env_id, "reverse-text");
    assert_eq!(info.splits.iter().find(|s| s.name == "train").map(|s| s.size), Some(12));
    drop(rt);
    terminate_and_expect_a_clean_exit(child);
}

/// The signal handlers exist before the address is announced, so a launcher that gives up on a
/// server right after it started never sees it die of the signal's default action.
#[test]
fn a_sigterm_right_after_the_listening_line_stops_it_cleanly() {
    let (child, _) = start();
    terminate_and_expect_a_clean_exit(child);
}

#[test]
fn an_unknown_env_fails_with_its_name() {
    let o = Command::new(env!("CARGO_BIN_EXE_rl"))
        .args(["env-server", "--env.id", "nope"])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("unknown environment") && err.contains("reverse-text"), "{err}");
}
