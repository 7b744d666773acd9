//! The Python worker process behind a `python` env (`python -m rl_env.worker`) or a `verifiers`
//! env (`python -m rl_env.verifiers_host`): one JSON line per
//! request and per answer over its stdin/stdout, any number of requests in flight. One task owns
//! the process and the table of pending calls; a worker that dies fails the calls it held (as
//! retryable infrastructure errors) and is started again by the next call.

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rl_serve::{Error, Result};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// Longest line either side may send (the first one carries every dataset row).
const MAX_LINE_BYTES: u64 = 512 << 20;
/// Lines of the worker's stderr kept for error messages.
const STDERR_TAIL: usize = 40;
/// Version of the line protocol this host speaks (`rl_env.worker.PROTOCOL_VERSION`).
const PROTOCOL_VERSION: u64 = 1;

/// How to start the worker.
#[derive(Debug, Clone)]
pub(crate) struct Launch {
    /// The interpreter (`python3`, or a venv's `bin/python`).
    pub python: String,
    /// The module run with `-m` (`rl_env.worker`, `rl_env.verifiers_host`).
    pub entry: &'static str,
    /// Its command-line arguments.
    pub argv: Vec<std::ffi::OsString>,
    /// Directories put before `PYTHONPATH`.
    pub sys_path: Vec<PathBuf>,
    /// How long loading the environment may take.
    pub start_timeout: Duration,
}

/// A handle to the worker task; calls are answered in any order.
#[derive(Debug)]
pub(crate) struct Worker {
    commands: mpsc::Sender<Request>,
    next_id: AtomicU64,
    call_timeout: Duration,
}

enum Request {
    Call { id: u64, method: &'static str, params: Value, reply: oneshot::Sender<Result<Value>> },
    Forget { id: u64 },
}

struct Process {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<std::result::Result<String, String>>,
    stderr: JoinHandle<VecDeque<String>>,
}

impl Worker {
    /// Starts the worker and returns it with the environment's description (its `ready` line).
    pub(crate) async fn start(launch: Launch, call_timeout: Duration) -> Result<(Worker, Value)> {
        let (process, description, digest) = spawn(&launch).await?;
        let (commands, rx) = mpsc::channel(1024);
        tokio::spawn(run(launch, process, digest, rx));
        Ok((Worker { commands, next_id: AtomicU64::new(1), call_timeout }, description))
    }

    /// Calls `method`; the worker's own failures come back as env errors, a dead or silent
    /// worker as retryable infrastructure or timeout errors.
    pub(crate) async fn call(&self, method: &'static str, params: Value) -> Result<Value> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (reply, rx) = oneshot::channel();
        let gone = || Error::Infrastructure(String::from("the python worker task has stopped"));
        self.commands.send(Request::Call { id, method, params, reply }).await.map_err(|_| gone())?;
        match tokio::time::timeout(self.call_timeout, rx).await {
            Ok(answer) => answer.map_err(|_| gone())?,
            Err(_) => {
                let _ = self.commands.try_send(Request::Forget { id });
                Err(Error::Timeout(format!(
                    "the python environment did not answer `{method}` within {:?} (env.args.call_timeout_s)",
                    self.call_timeout
                )))
            }
        }
    }
}

/// The worker task: owns the process and the pending calls.
async fn run(launch: Launch, process: Process, digest: u64, mut commands: mpsc::Receiver<Request>) {
    let mut process = Some(process);
    let mut pending: HashMap<u64, oneshot::Sender<Result<Value>>> = HashMap::new();
    loop {
        let next_line = async {
            match process.as_mut() {
                Some(p) => p.lines.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            command = commands.recv() => match command {
                None => break,
                Some(Request::Forget { id }) => {
                    pending.remove(&id);
                }
                Some(Request::Call { id, method, params, reply }) => {
                    if process.is_none() {
                        match restart(&launch, digest).await {
                            Ok(p) => process = Some(p),
                            Err(e) => {
                                let _ = reply.send(Err(e));
                                continue;
                            }
                        }
                    }
                    let Some(p) = process.as_mut() else { continue };
                    let line = format!("{}\n", json!({"id": id, "method": method, "params": params}));
                    pending.insert(id, reply);
                    if let Err(e) = p.stdin.write_all(line.as_bytes()).await {
                        let message = format!("cannot write to the python worker: {e}");
                        fail_all(&mut pending, process.take(), &message).await;
                    }
                }
            },
            line = next_line => match line {
                Some(Ok(line)) => answer(&mut pending, &line),
                Some(Err(message)) => fail_all(&mut pending, process.take(), &message).await,
                None => fail_all(&mut pending, process.take(), "the python worker exited").await,
            },
        }
    }
    if let Some(mut p) = process {
        let _ = p.child.start_kill();
        let _ = p.child.wait().await;
    }
}

/// Hands one answer line to its caller.
fn answer(pending: &mut HashMap<u64, oneshot::Sender<Result<Value>>>, line: &str) {
    let parsed: Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(error = %e, "the python worker wrote a line that is not JSON; ignored");
            return;
        }
    };
    let Some(reply) = parsed.get("id").and_then(Value::as_u64).and_then(|id| pending.remove(&id)) else {
        return; // an answer to a call that timed out, or the worker's complaint about a request
    };
    let result = match (parsed.get("result"), parsed.get("error")) {
        (Some(result), None) => Ok(result.clone()),
        (_, Some(error)) => {
            let message = error.get("message").and_then(Value::as_str).unwrap_or("(no message)");
            Err(Error::Env(message.to_owned()))
        }
        (None, None) => Err(Error::Env(String::from("the python worker answered neither `result` nor `error`"))),
    };
    let _ = reply.send(result);
}

/// The worker is gone: every pending call fails with what it left on stderr.
async fn fail_all(pending: &mut HashMap<u64, oneshot::Sender<Result<Value>>>, process: Option<Process>, why: &str) {
    let detail = match process {
        Some(p) => ended(p).await,
        None => String::new(),
    };
    tracing::error!("{why}{detail}; it is started again on the next call");
    for (_, reply) in pending.drain() {
        let _ = reply.send(Err(Error::Infrastructure(format!("{why}{detail}"))));
    }
}

/// Stops a process and says how it ended, with the tail of its stderr.
async fn ended(mut p: Process) -> String {
    drop(p.stdin);
    let status = match tokio::time::timeout(Duration::from_secs(2), p.child.wait()).await {
        Ok(Ok(status)) => status.to_string(),
        _ => {
            let _ = p.child.start_kill();
            let _ = p.child.wait().await;
            String::from("killed")
        }
    };
    let tail = tokio::time::timeout(Duration::from_secs(2), p.stderr).await.ok().and_then(|r| r.ok());
    match tail {
        Some(lines) if !lines.is_empty() => {
            format!(" ({status}); its stderr ended with:\n{}", Vec::from(lines).join("\n"))
        }
        _ => format!(" ({status})"),
    }
}

async fn restart(launch: &Launch, digest: u64) -> Result<Process> {
    let (process, _, new_digest) = spawn(launch).await?;
    if new_digest != digest {
        ended(process).await;
        return Err(Error::Env(String::from(
            "the python environment describes itself differently after a restart (its code or data changed); \
             restart the env server",
        )));
    }
    tracing::info!("python worker restarted");
    Ok(process)
}

/// Starts the process and waits for its `ready` line: (process, the env's description, its digest).
async fn spawn(launch: &Launch) -> Result<(Process, Value, u64)> {
    let mut command = Command::new(&launch.python);
    command.arg("-m").arg(launch.entry).args(&launch.argv);
    if !launch.sys_path.is_empty() {
        let mut paths = launch.sys_path.clone();
        if let Some(existing) = std::env::var_os("PYTHONPATH") {
            paths.extend(std::env::split_paths(&existing));
        }
        let joined = std::env::join_paths(paths)
            .map_err(|e| Error::bad_request("env.args.sys_path", format!("cannot form PYTHONPATH: {e}")))?;
        command.env("PYTHONPATH", joined);
    }
    command.env("PYTHONUNBUFFERED", "1");
    command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    let mut child = command
        .spawn()
        .map_err(|e| Error::bad_request("env.args.python", format!("cannot start {:?}: {e}", launch.python)))?;
    let (Some(stdin), Some(stdout), Some(stderr)) = (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(Error::Env(String::from("the python worker's pipes are missing")));
    };
    let (tx, mut lines) = mpsc::channel(1024);
    tokio::spawn(read_lines(stdout, tx));
    let stderr = tokio::spawn(forward_stderr(stderr));
    let first = tokio::time::timeout(launch.start_timeout, lines.recv()).await;
    let mut process = Process { child, stdin, lines, stderr };
    let line = match first {
        Ok(Some(Ok(line))) => line,
        Ok(Some(Err(e))) => return Err(Error::Env(format!("{e}{}", ended(process).await))),
        Ok(None) => {
            let detail = ended(process).await;
            return Err(Error::Env(format!(
                "the python worker exited before it was ready{detail}\n(is the rl-env package importable by {:?}? \
                 `pip install python/rl-env`, or list its `src` in env.args.sys_path)",
                launch.python
            )));
        }
        Err(_) => {
            let _ = process.child.start_kill();
            return Err(Error::Env(format!(
                "the python environment was not ready within {:?} (env.args.start_timeout_s){}",
                launch.start_timeout,
                ended(process).await
            )));
        }
    };
    let ready: Value = serde_json::from_str(&line)
        .map_err(|e| Error::Env(format!("the python worker's first line is not JSON ({e}): {:.200}", line)))?;
    match ready.get("event").and_then(Value::as_str) {
        Some("ready") => {}
        Some("error") => {
            let message = ready.get("message").and_then(Value::as_str).unwrap_or("(no message)").to_owned();
            let detail = ended(process).await;
            return Err(Error::Env(format!("loading the python environment failed: {message}{detail}")));
        }
        _ => return Err(Error::Env(format!("the python worker's first line is not `ready`: {:.200}", line))),
    }
    let protocol = ready.get("protocol").and_then(Value::as_u64).unwrap_or(0);
    if protocol != PROTOCOL_VERSION {
        let _ = process.child.start_kill();
        return Err(Error::Env(format!(
            "the rl_env package speaks protocol {protocol}, this server {PROTOCOL_VERSION}: install the rl-env \
             package from the same checkout as the server"
        )));
    }
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    line.hash(&mut hasher);
    let description = ready.get("env").cloned().unwrap_or(Value::Null);
    Ok((process, description, hasher.finish()))
}

/// Reads the worker's stdout line by line; a line over the bound or a read error ends it.
async fn read_lines(stdout: ChildStdout, tx: mpsc::Sender<std::result::Result<String, String>>) {
    let mut reader = BufReader::new(stdout);
    loop {
        let mut buf = Vec::new();
        let read = (&mut reader).take(MAX_LINE_BYTES + 1).read_until(b'\n', &mut buf).await;
        let item = match read {
            Ok(0) => return,
            Ok(_) if buf.len() as u64 > MAX_LINE_BYTES => {
                Err(format!("the python worker wrote a line over {MAX_LINE_BYTES} bytes"))
            }
            Ok(_) => {
                String::from_utf8(buf).map_err(|_| String::from("the python worker wrote a line that is not UTF-8"))
            }
            Err(e) => Err(format!("cannot read from the python worker: {e}")),
        };
        let last = item.is_err();
        if tx.send(item).await.is_err() || last {
            return;
        }
    }
}

/// Logs the worker's stderr (the user's prints and tracebacks) and keeps its last lines.
async fn forward_stderr(stderr: tokio::process::ChildStderr) -> VecDeque<String> {
    let mut tail = VecDeque::with_capacity(STDERR_TAIL);
    let mut lines = BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        tracing::info!(target: "python", "{line}");
        if tail.len() == STDERR_TAIL {
            tail.pop_front();
        }
        tail.push_back(line);
    }
    tail
}
