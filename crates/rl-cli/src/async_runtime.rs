//! The multi-threaded async runtime the server and orchestrator commands run on.

use anyhow::Context;

/// A multi-threaded runtime with every driver (I/O, time) enabled.
pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the async runtime")
}
