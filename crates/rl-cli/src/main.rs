//! The `rl` command: parses the subcommand, loads its config, and runs it (or, with `--dry-run`,
//! writes the resolved configs and exits).

mod async_runtime;
mod commands;
mod env_server;
mod eval;
mod help;
mod interrupt;
mod launcher;
mod liveness;
mod logging;
mod model_merge;
mod orchestrating;
mod orphan;
mod plot;
mod run_lock;
mod serving;
mod sft;
mod sft_data;
mod tensorboard;
mod tracking;
mod training;

use std::io::Write;
use std::process::ExitCode;

/// Large freed blocks (activations, logits, gradients of a real-size model) are reused instead of
/// page-faulted in fresh every step.
#[global_allocator]
static ALLOC: rl_kernels::LargeBlockCache = rl_kernels::LargeBlockCache::new();

fn main() -> ExitCode {
    // Before any thread exists (the orphan watch below starts one).
    rl_kernels::tune_process();
    if let Err(e) = rl_kernels::cpu::simd::check_simd_var() {
        let _ = writeln!(std::io::stderr().lock(), "error: {e}");
        return ExitCode::from(2);
    }
    orphan::exit_with_launcher();
    let args: Vec<String> = std::env::args().skip(1).collect();
    match commands::run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        // `rl --help | head`: the reader has all it wanted, nothing failed.
        Err(e) if closed_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err, "error: {}", error_text(&e));
            ExitCode::from(2)
        }
    }
}

/// Whether the error is writing to a pipe whose reader has gone.
fn closed_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe))
}

/// The error and its causes on one line, each said once: library errors often include their
/// source's text in their own message, which `{:#}` would then print a second time.
fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let part = cause.to_string();
        if text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_closed_pipe_is_not_a_failure() {
        let pipe = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "Broken pipe (os error 32)");
        assert!(super::closed_pipe(&anyhow::Error::new(pipe).context("printing help")));
        assert!(!super::closed_pipe(&anyhow::anyhow!("no such file")));
    }

    #[test]
    fn causes_already_in_the_message_are_not_repeated() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory (os error 2)");
        let e = anyhow::Error::new(io).context("cannot read x.toml: No such file or directory (os error 2)");
        assert_eq!(super::error_text(&e), "cannot read x.toml: No such file or directory (os error 2)");
        let e = anyhow::anyhow!("inner").context("outer");
        assert_eq!(super::error_text(&e), "outer: inner");
    }
}
