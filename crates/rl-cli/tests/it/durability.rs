//! A disk that fills up mid-run: the process stops with an error naming the file it could not
//! write, and leaves no checkpoint that `--resume` would load half-written. The full disk is the
//! file-size limit (`ulimit -f`, with SIGXFSZ ignored so writes fail with EFBIG as they would with
//! ENOSPC): no mounts or privileges needed, so it runs on any CI machine.

use std::path::Path;
use std::process::{Command, Output};

use crate::{rl, root, stderr};

/// `rl args...` with writes limited to files of `kib` KiB.
fn rl_with_file_limit(kib: u64, args: &[&str]) -> Output {
    Command::new("bash")
        .arg("-c")
        .arg(format!("trap '' XFSZ; ulimit -f {kib}; exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_rl"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("run rl under bash")
}

/// Checkpoint step directories that are complete (their marker written last).
fn complete_checkpoints(run: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(run.join("checkpoints")) else { return Vec::new() };
    let mut out: Vec<String> = entries
        .flatten()
        .filter(|e| {
            e.file_name().to_string_lossy().starts_with("step_") && !e.file_name().to_string_lossy().contains('.')
        })
        .filter(|e| {
            rl_run::RunDir::new(run).trainer_checkpoint_marker(step_of(&e.file_name().to_string_lossy())).exists()
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

fn step_of(name: &str) -> u64 {
    name.trim_start_matches("step_").parse().unwrap_or(u64::MAX)
}

#[test]
fn a_full_disk_stops_sft_naming_the_file_and_leaves_no_half_written_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("tiny");
    assert!(rl(&["model", "init", "--out", base.to_str().unwrap(), "--seed", "3"]).status.success());
    let out = tmp.path().to_str().unwrap();
    let args = [
        "sft",
        "@",
        "configs/reverse_text/sft.toml",
        "--output-dir",
        out,
        "--model.path",
        base.to_str().unwrap(),
        "--max-steps",
        "4",
        "--batch-size",
        "4",
        "--val.interval",
        "100",
        "--ckpt.interval",
        "2",
        "--scheduler.warmup-steps",
        "0",
    ];
    // The tiny model's weights are ~3.2 MB: any checkpoint or model file exceeds a 1 MiB limit.
    let o = rl_with_file_limit(1024, &args);
    let err = stderr(&o);
    assert!(!o.status.success(), "the run must fail: {err}");
    assert!(err.contains("File too large") || err.contains("No space"), "names the I/O error: {err}");
    assert!(err.contains(out), "names the file it could not write: {err}");
    let run = tmp.path().join("reverse-text-sft");
    assert!(complete_checkpoints(&run).is_empty(), "no complete checkpoint: {:?}", complete_checkpoints(&run));
    assert!(!run.join("model").join("model.safetensors").exists(), "no final model");

    // Resuming finds nothing loadable and says so (it does not load a partial checkpoint).
    let mut resume: Vec<&str> = args.to_vec();
    resume.push("--resume");
    let o = rl(&resume);
    assert!(!o.status.success(), "nothing to resume from");
    assert!(stderr(&o).to_lowercase().contains("checkpoint"), "{}", stderr(&o));

    // With room on the disk the same run (started clean) completes and writes its checkpoints.
    let mut clean: Vec<&str> = args.to_vec();
    clean.push("--clean");
    let o = rl(&clean);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(complete_checkpoints(&run), vec!["step_2", "step_4"]);
}
