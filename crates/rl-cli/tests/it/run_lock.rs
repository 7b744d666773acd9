//! One run per run directory: while a run holds `<run>/.lock`, a second `rl rl` or `rl sft` on the
//! same directory fails at once naming the holder, and its `--clean` deletes nothing of the
//! running run's files.

use rl_run::RunDir;

use crate::{rl, stderr};

#[test]
fn a_second_launch_on_a_run_directory_in_use_fails_naming_the_holder_and_cleans_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().to_str().unwrap();
    let model = tmp.path().join("tiny");
    assert!(rl(&["model", "init", "--out", model.to_str().unwrap(), "--seed", "1"]).status.success());
    let holder = format!("(pid {})", std::process::id());
    for (command, config, name) in [
        ("sft", "configs/reverse_text/sft.toml", "reverse-text-sft"),
        ("rl", "configs/reverse_text/rl.toml", "reverse-text-rl"),
    ] {
        let run = RunDir::new(tmp.path().join(name));
        let lock = run.lock().expect("the test holds the run directory");
        std::fs::write(run.metrics(), b"{\"step\": 1}\n").unwrap();
        let o = rl(&[command, "@", config, "--output-dir", out, "--model.path", model.to_str().unwrap(), "--clean"]);
        let err = stderr(&o);
        assert!(!o.status.success(), "rl {command} ran beside the holder: {err}");
        assert!(err.contains("is in use by another rl process") && err.contains(&holder), "rl {command}: {err}");
        assert_eq!(std::fs::read(run.metrics()).unwrap(), b"{\"step\": 1}\n", "rl {command} --clean deleted a file");
        drop(lock);
    }
}
