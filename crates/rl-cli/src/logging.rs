//! Process logging: `tracing` to stderr at the config's level (`RUST_LOG` overrides), text or JSON.

use rl_configs::{LogConfig, LogLevel};
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber once; later calls are no-ops.
pub(crate) fn init(log: &LogConfig) {
    let level = match log.level {
        LogLevel::Error => "error",
        LogLevel::Warn => "warn",
        LogLevel::Info => "info",
        LogLevel::Debug => "debug",
        LogLevel::Trace => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    // Colours only on a terminal: the launcher's children log to files, which must stay plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    let _ = if log.json { builder.json().try_init() } else { builder.try_init() };
}
