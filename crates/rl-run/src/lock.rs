//! One run at a time in a run directory: `rl rl` and `rl sft` hold an exclusive lock on
//! `<run>/.lock` for their whole life, so a second launch on the same `--run.name` (another
//! terminal, a script started twice) fails at once with the holder's pid, instead of the two runs
//! writing, cleaning and deleting each other's steps. The kernel releases the lock when the holder
//! exits however it exits, so a crashed run never leaves a stale lock behind. A filesystem that
//! cannot lock files (some network mounts) leaves the run unguarded rather than stopped.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::RunDir;

/// The lock file's name inside the run directory; `--clean` keeps it (deleting a held lock file
/// would let the next process lock a new file beside a running holder).
pub const LOCK_FILE: &str = ".lock";

/// Why a run directory could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another live process holds the lock.
    #[error(
        "run directory {} is in use by another rl process{}: wait for it to finish, stop it, or choose another --run.name",
        dir.display(),
        holder.map(|pid| format!(" (pid {pid})")).unwrap_or_default()
    )]
    Busy {
        /// The run directory.
        dir: PathBuf,
        /// The holder's pid, as it wrote it into the lock file.
        holder: Option<u32>,
    },
    /// The lock file could not be created, read or locked.
    #[error("cannot lock {}: {source}", path.display())]
    Io {
        /// The lock file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
}

/// An exclusive hold on a run directory, released when dropped (or when the process exits).
#[derive(Debug)]
pub struct RunLock {
    _file: File,
    /// Why the directory is not locked after all: a filesystem without `flock` (some network
    /// mounts answer ENOLCK). The run goes on, unguarded, rather than not at all.
    unsupported: Option<std::io::Error>,
}

impl RunLock {
    /// `Some(reason)` when the filesystem could not lock the file and the run is not guarded.
    pub fn unsupported(&self) -> Option<&std::io::Error> {
        self.unsupported.as_ref()
    }
}

impl RunDir {
    /// `<run>/.lock`.
    pub fn lock_file(&self) -> PathBuf {
        self.root().join(LOCK_FILE)
    }

    /// Takes the run directory for this process (creating it), or says who has it.
    pub fn lock(&self) -> Result<RunLock, LockError> {
        let path = self.lock_file();
        let io = |source| LockError::Io { path: path.clone(), source };
        std::fs::create_dir_all(self.root()).map_err(io)?;
        let mut file =
            OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(LockError::Busy { dir: self.root().to_path_buf(), holder: holder_pid(&mut file) });
            }
            Err(TryLockError::Error(e)) => return Ok(RunLock { _file: file, unsupported: Some(e) }),
        }
        // The pid is for the message a second process prints; the lock itself is the kernel's.
        file.set_len(0).map_err(io)?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        Ok(RunLock { _file: file, unsupported: None })
    }

    /// Deletes everything in the run directory but its lock file (`--clean`, lock held).
    pub fn clear(&self) -> std::io::Result<()> {
        let entries = match std::fs::read_dir(self.root()) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            if entry.file_name() == LOCK_FILE {
                continue;
            }
            remove(&entry.path(), entry.file_type()?.is_dir())?;
        }
        Ok(())
    }
}

fn remove(path: &Path, is_dir: bool) -> std::io::Result<()> {
    if is_dir { std::fs::remove_dir_all(path) } else { std::fs::remove_file(path) }
}

fn holder_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_run(name: &str) -> RunDir {
        let root = std::env::temp_dir().join(format!("rl-run-lock-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        RunDir::new(root)
    }

    #[test]
    fn a_second_lock_on_a_held_run_directory_fails_with_the_holders_pid_and_succeeds_after_release() {
        let run = temp_run("busy");
        let held = run.lock().expect("first lock");
        assert!(held.unsupported().is_none(), "the temp directory's filesystem locks files");
        let err = run.lock().expect_err("second lock while held");
        let text = err.to_string();
        assert!(matches!(err, LockError::Busy { holder: Some(pid), .. } if pid == std::process::id()), "{text}");
        assert!(text.contains(&format!("pid {}", std::process::id())) && text.contains("--run.name"), "{text}");
        drop(held);
        let again = run.lock().expect("lock after release");
        drop(again);
        std::fs::remove_dir_all(run.root()).expect("cleanup");
    }

    #[test]
    fn clear_keeps_the_lock_file_and_deletes_everything_else() {
        let run = temp_run("clear");
        let held = run.lock().expect("lock");
        std::fs::create_dir_all(run.broadcast(3)).expect("dir");
        std::fs::write(run.broadcast_marker(3), b"").expect("marker");
        std::fs::write(run.metrics(), b"{}\n").expect("metrics");
        assert!(run.has_run_output());
        run.clear().expect("clear");
        let left: Vec<_> = std::fs::read_dir(run.root()).expect("read").flatten().map(|e| e.file_name()).collect();
        assert_eq!(left, vec![std::ffi::OsString::from(LOCK_FILE)]);
        assert!(!run.has_run_output(), "a directory holding only its lock has no run output");
        assert!(matches!(run.lock(), Err(LockError::Busy { .. })), "the lock survives the clear");
        drop(held);
        std::fs::remove_dir_all(run.root()).expect("cleanup");
    }
}
