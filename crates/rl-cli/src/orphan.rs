//! Children of the `rl rl` launcher exit when it is gone, however it died (SIGKILL, the OOM
//! killer, a dropped ssh session): the launcher passes its pid in `RL_LAUNCHER_PID`, and a thread
//! here checks twice a second that it is still this process's parent (no `prctl`, so no `unsafe`).

use std::io::Write;
use std::time::Duration;

/// The variable the launcher sets in its children's environment.
pub(crate) const LAUNCHER_PID: &str = "RL_LAUNCHER_PID";

/// Starts the watch when this process was started by a launcher.
pub(crate) fn exit_with_launcher() {
    let Some(launcher) = std::env::var(LAUNCHER_PID).ok().and_then(|p| p.parse::<u32>().ok()) else { return };
    let watch = move || {
        loop {
            if std::os::unix::process::parent_id() != launcher {
                let _ =
                    writeln!(std::io::stderr().lock(), "error: the rl rl launcher (pid {launcher}) is gone; stopping");
                std::process::exit(1);
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    };
    let _ = std::thread::Builder::new().name(String::from("launcher-watch")).spawn(watch);
}
