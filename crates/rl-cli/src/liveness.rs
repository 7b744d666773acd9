//! The launcher's progress check: what each child is doing when no step finishes (stopped by a
//! signal, CPU used since the last look, the inference engine's `/health`), so a stall is reported
//! with a culprit and its log instead of as silence.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// One child as the check sees it.
pub(crate) struct Child<'a> {
    pub(crate) name: &'a str,
    pub(crate) pid: u32,
}

/// What a look at the children found.
pub(crate) struct Report {
    /// One line per child (and one for the inference engine's health).
    pub(crate) lines: Vec<String>,
    /// Children that cannot be making progress: stopped, or an unhealthy inference server.
    pub(crate) suspects: Vec<String>,
}

/// CPU time of each child at the previous look, to say who worked since.
#[derive(Default)]
pub(crate) struct Watch {
    cpu_ticks: HashMap<u32, u64>,
}

impl Watch {
    /// Looks at every child and the `/health` of each inference server (name, `host:port`).
    pub(crate) fn look(&mut self, children: &[Child<'_>], inference: &[(String, String)]) -> Report {
        let mut report = Report { lines: Vec::new(), suspects: Vec::new() };
        for c in children {
            let Some((state, ticks)) = proc_stat(c.pid) else {
                report.lines.push(format!("{} (pid {}): no process information", c.name, c.pid));
                continue;
            };
            let worked = self.cpu_ticks.insert(c.pid, ticks).map(|before| ticks.saturating_sub(before));
            let cpu = worked.map(|t| format!(", {:.1}s CPU since the last look", t as f64 / USER_HZ));
            let what = match state {
                'T' | 't' => {
                    report.suspects.push(c.name.to_owned());
                    "STOPPED (by a signal or a debugger)"
                }
                'D' => "waiting on a disk or device",
                'R' => "running",
                _ => "sleeping",
            };
            report.lines.push(format!("{} (pid {}): {what}{}", c.name, c.pid, cpu.unwrap_or_default()));
        }
        for (name, addr) in inference {
            match health(addr) {
                Ok(()) => report.lines.push(format!("{name} /health: ok")),
                Err(why) => {
                    report.suspects.push(name.clone());
                    report.lines.push(format!("{name} /health: {why}"));
                }
            }
        }
        report
    }
}

/// State letter and user + system CPU ticks from `/proc/<pid>/stat` (Linux).
fn proc_stat(pid: u32) -> Option<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces: fields start after the last `)`.
    let fields: Vec<&str> = text[text.rfind(')')? + 1..].split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((state, utime + stime))
}

/// Clock ticks per second of `/proc` times (USER_HZ: 100 on every Linux ABI in use).
const USER_HZ: f64 = 100.0;

/// `GET /health` on `host:port` within 5 s: `Ok` for a 200, else what was seen.
pub(crate) fn health(addr: &str) -> Result<(), String> {
    let limit = Duration::from_secs(5);
    let target = addr.to_socket_addrs().ok().and_then(|mut a| a.next()).ok_or_else(|| format!("bad address {addr}"))?;
    let mut stream = TcpStream::connect_timeout(&target, limit).map_err(|e| format!("cannot connect: {e}"))?;
    stream.set_read_timeout(Some(limit)).map_err(|e| e.to_string())?;
    stream.set_write_timeout(Some(limit)).map_err(|e| e.to_string())?;
    write!(stream, "GET /health HTTP/1.0\r\nHost: {addr}\r\n\r\n").map_err(|e| format!("cannot send: {e}"))?;
    let mut answer = Vec::new();
    stream.take(64 * 1024).read_to_end(&mut answer).map_err(|e| format!("no answer within 5s ({e})"))?;
    let answer = String::from_utf8_lossy(&answer);
    let status = answer.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) == Some("200") {
        return Ok(());
    }
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default().trim();
    Err(format!("{status} {body}"))
}

/// `host:port` of an `http://host:port/...` URL.
pub(crate) fn host_port(url: &str) -> Option<&str> {
    let rest = url.strip_prefix("http://")?;
    Some(rest.split('/').next().unwrap_or(rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_child_is_a_suspect_and_a_running_one_is_not() {
        let mut sleeper = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = sleeper.id();
        let mut watch = Watch::default();
        let look = |w: &mut Watch| w.look(&[Child { name: "worker", pid }], &[]);
        let first = look(&mut watch);
        assert!(first.suspects.is_empty(), "{:?}", first.lines);
        assert!(std::process::Command::new("kill").args(["-STOP", &pid.to_string()]).status().unwrap().success());
        // The stop takes effect once the child leaves what it is in: on a busy machine it was
        // still reading its program from disk ('D') 100 ms after the signal.
        let state = || std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let stopped_state =
            |stat: String| stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('T'));
        for _ in 0..100 {
            if stopped_state(state()) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let stopped = look(&mut watch);
        assert_eq!(stopped.suspects, ["worker"], "{:?}", stopped.lines);
        assert!(stopped.lines[0].contains("STOPPED") && stopped.lines[0].contains("CPU since"), "{:?}", stopped.lines);
        sleeper.kill().unwrap();
        sleeper.wait().unwrap();
    }

    #[test]
    fn an_unreachable_inference_server_is_a_suspect() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        drop(listener);
        let report = Watch::default().look(&[], &[(String::from("inference"), addr)]);
        assert_eq!(report.suspects, ["inference"]);
        assert_eq!(host_port("http://127.0.0.1:8000/v1"), Some("127.0.0.1:8000"));
    }
}
