//! The `rl` command: parses the subcommand, loads its config, and runs it (or, with `--dry-run`,
//! writes the resolved configs and exits).

mod commands;
mod env_server;
mod launcher;
mod logging;
mod orchestrating;
mod orphan;
mod plot;
mod serving;
mod sft;
mod sft_data;
mod training;

use std::io::Write;
use std::process::ExitCode;

/// The multi-threaded async runtime the server and orchestrator commands run on.
pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    use anyhow::Context;
    tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the async runtime")
}

fn main() -> ExitCode {
    orphan::exit_with_launcher();
    let args: Vec<String> = std::env::args().skip(1).collect();
    match commands::run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err, "error: {e:#}");
            ExitCode::from(2)
        }
    }
}
