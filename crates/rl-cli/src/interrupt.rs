//! Ctrl-C / SIGTERM for the synchronous commands (`rl rl`'s launcher, `rl sft`): a watcher on a
//! small runtime of its own sets one flag, which the command checks between its steps.

use std::sync::atomic::{AtomicBool, Ordering};

/// Set by the first Ctrl-C (or SIGTERM) the process receives.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Starts watching for Ctrl-C / SIGTERM (installed before this returns, not whenever the watcher's
/// thread first runs).
pub(crate) fn watch() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let signal = {
        let _context = rt.enter();
        rl_serve::shutdown_signal()
    };
    std::thread::Builder::new().name(String::from("signals")).spawn(move || {
        rt.block_on(signal);
        INTERRUPTED.store(true, Ordering::SeqCst);
    })?;
    Ok(())
}

/// The flag [`watch`] sets.
pub(crate) fn flag() -> &'static AtomicBool {
    &INTERRUPTED
}

/// Whether Ctrl-C or SIGTERM has been received.
pub(crate) fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}
