//! The run directory lock of `rl rl` and `rl sft`, with the console note when it cannot be taken.

use std::io::Write;

/// Takes the run directory for this `rl rl` / `rl sft` (held until dropped); on a filesystem that
/// cannot lock files the run goes on, and the console says it is unguarded.
pub(crate) fn lock_run(run: &rl_run::RunDir) -> anyhow::Result<rl_run::RunLock> {
    let lock = run.lock()?;
    if let Some(why) = lock.unsupported() {
        writeln!(
            std::io::stderr().lock(),
            "note: cannot lock {} ({why}): nothing stops a second run from using this directory at the same time",
            run.lock_file().display()
        )?;
    }
    Ok(lock)
}
