//! The fields every env entry (`[[orchestrator.train.env]]`, `[[orchestrator.eval.env]]`) has —
//! which env (id, name, args) and where its server is (address, command, serve) — declared once
//! by [`env_entry!`] with the methods that read them. A macro and not `#[serde(flatten)]`: flatten
//! buffers the table, so a wrongly typed field's error would lose its key.

use crate::error::{ConfigError, Result};
use crate::shared::{ServeConfig, Table, plain_name};

/// The endpoint fields of an env entry, borrowed.
#[derive(Debug, Clone, Copy)]
pub struct EnvEndpoint<'a> {
    /// Environment id.
    pub id: &'a str,
    /// Its name in metrics and paths, when set.
    pub name: Option<&'a str>,
    /// Environment arguments.
    pub args: &'a Table,
    /// Address of an already running env server.
    pub address: Option<&'a str>,
    /// A user's env-server program to run instead of `rl env-server`.
    pub command: Option<&'a [String]>,
    /// Settings of the spawned env server.
    pub serve: &'a ServeConfig,
}

impl EnvEndpoint<'_> {
    /// The env's name (its id unless set).
    pub fn display_name(&self) -> &str {
        self.name.unwrap_or(self.id)
    }

    /// Checks the endpoint fields of the entry at `ek`: a non-empty id, a name usable as a file
    /// name, a command or an address (not both), the spawned server's settings.
    pub(crate) fn validate(&self, ek: &str) -> Result<()> {
        if self.id.trim().is_empty() {
            return Err(ConfigError::invalid(format!("{ek}.id"), "must not be empty"));
        }
        // Env names become file names (resolved configs, logs): never a path.
        plain_name(&format!("{ek}.{}", if self.name.is_some() { "name" } else { "id" }), self.display_name())?;
        if let Some(command) = self.command {
            if command.first().is_none_or(|p| p.trim().is_empty()) {
                return Err(ConfigError::invalid(
                    format!("{ek}.command"),
                    "must name a program first, e.g. [\"./target/release/my-env-server\"]",
                ));
            }
            if self.address.is_some() {
                return Err(ConfigError::invalid(
                    format!("{ek}.command"),
                    "an env is either started by the launcher (`command`) or already running (`address`), not both",
                ));
            }
        }
        if self.address.is_none() {
            self.serve.validate(&format!("{ek}.serve"))?;
        }
        Ok(())
    }
}

/// Declares an env entry struct: `id`, `name` and `args` first, the entry's own fields, then
/// `address`, `command` and `serve`; with `endpoint()`, `display_name()` and `connect_to()`.
macro_rules! env_entry {
    ($(#[$meta:meta])* pub struct $name:ident { $($own:tt)* }) => {
        $(#[$meta])*
        pub struct $name {
            /// Environment id (e.g. `reverse-text`, `alphabet-sort`).
            pub id: String,
            /// Name of this env in metrics and paths (default: the id). Must be unique among the
            /// envs of its list.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub name: Option<String>,
            /// Environment arguments (dataset size, seed, turns, ...), passed to the env unchanged.
            #[serde(default)]
            pub args: Table,
            $($own)*
            /// Address of an already running env server (`host:port`); unset: the launcher spawns one.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub address: Option<String>,
            /// The program (and its first arguments) the launcher runs instead of `rl env-server` for
            /// this env: a user's own env-server binary (built with `rl_serve::env_server_main`). It is
            /// given `@ <the env-server config>` and must print the `listening` line. Not with `address`.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub command: Option<Vec<String>>,
            /// Settings of the spawned env server.
            #[serde(default)]
            pub serve: ServeConfig,
        }

        impl $name {
            /// The endpoint fields, borrowed.
            pub fn endpoint(&self) -> $crate::env_entry::EnvEndpoint<'_> {
                $crate::env_entry::EnvEndpoint {
                    id: &self.id,
                    name: self.name.as_deref(),
                    args: &self.args,
                    address: self.address.as_deref(),
                    command: self.command.as_deref(),
                    serve: &self.serve,
                }
            }

            /// The env's name (its id unless set).
            pub fn display_name(&self) -> &str {
                self.name.as_deref().unwrap_or(&self.id)
            }

            /// Points the entry at a running server (how it was started is not the connecting
            /// side's business).
            pub fn connect_to(&mut self, address: String) {
                self.address = Some(address);
                self.command = None;
            }
        }
    };
}

pub(crate) use env_entry;
