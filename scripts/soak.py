#!/usr/bin/env python3
"""Soak test of `rl rl` (issue #20): a long run on loopback while its parts keep failing.

- The policy's inference server runs outside the launcher, behind a proxy that answers a
  fraction (`--fault-rate`, default 1%) of chat requests with 503 (an overloaded endpoint).
- Every `--kill-every` seconds one part is killed with SIGKILL, in turn: the env server (the
  launcher restarts it) or the inference server (this script restarts it on its port; the
  orchestrator reloads the current weights into it).
- At the end (the run finished its --max-steps, or was interrupted at --minutes): every step exactly once in both metrics files, and a
  final model if it finished; the script prints the counts of kills, restarts, retried errors and dropped groups.

    python3 scripts/soak.py --minutes 30 [--kill-every 180] [--fault-rate 0.01] [--rl target/release/rl]
                            [--max-steps N] [--model outputs/reverse-text-sft-seed0/model]

Uses only the standard library and the `rl` binary (build it with `cargo build --release -p rl-cli`).
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FaultyProxy(http.server.ThreadingHTTPServer):
    """Forwards to the inference server; answers `rate` of chat requests with 503 instead."""

    daemon_threads = True

    def __init__(self, port: int, upstream: int, rate: float, seed: int) -> None:
        self.upstream, self.rate, self.rng, self.faults = upstream, rate, random.Random(seed), 0
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", port), ProxyHandler)


class ProxyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def handle(self) -> None:
        try:
            super().handle()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away (a killed env server)

    def log_message(self, *args) -> None:  # quiet
        pass

    def _forward(self) -> None:
        server: FaultyProxy = self.server  # type: ignore[assignment]
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with server.lock:
            fault = self.path.endswith("/chat/completions") and server.rng.random() < server.rate
            server.faults += fault
        if fault:
            self._answer(503, b'{"error": {"message": "injected fault", "type": "overloaded"}}', "application/json")
            return
        try:
            conn = http.client.HTTPConnection("127.0.0.1", server.upstream, timeout=600)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            self._answer(resp.status, resp.read(), resp.getheader("Content-Type", "application/json"))
        except OSError as e:  # the upstream is down (being restarted)
            self._answer(502, json.dumps({"error": {"message": str(e)}}).encode(), "application/json")

    def _answer(self, status: int, body: bytes, kind: str) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away (a killed env server): nothing to answer

    do_GET = _forward
    do_POST = _forward


def pids_naming(needle: str) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    out.append(int(entry.name))
            except OSError:
                pass
    return out


def start_inference(rl: str, model: Path, port: int, run_root: Path, log: Path) -> subprocess.Popen:
    args = [rl, "inference", "--model.path", str(model), "--port", str(port), "--weight-roots", json.dumps([str(run_root / "broadcasts")])]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=open(log, "a"), text=True)
    proc.stdout.readline()  # the listening line
    return proc


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=30)
    p.add_argument("--kill-every", type=float, default=180)
    p.add_argument("--fault-rate", type=float, default=0.01)
    p.add_argument("--rl", default=str(ROOT / "target/release/rl"))
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--config", type=Path, default=ROOT / "configs/reverse_text/rl.toml")
    p.add_argument("--max-steps", type=int, default=100000, help="stop earlier than --minutes after this many steps")
    p.add_argument("--model", type=Path, default=None,
                   help="policy to start from (e.g. an SFT model, so that rewards vary and every step trains); default: a random tiny model")
    p.add_argument("--max-restarts", type=int, default=1000, help="the launcher's restart budget per env server")
    args = p.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="rl-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    model = args.model or out / "tiny"
    if not model.exists():
        subprocess.run([args.rl, "model", "init", "--out", str(model), "--seed", str(args.seed)], check=True, stdout=subprocess.DEVNULL)
    run_root = out / "soak"
    inf_port, proxy_port = free_port(), free_port()
    proxy = FaultyProxy(proxy_port, inf_port, args.fault_rate, args.seed)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    inference = start_inference(args.rl, model, inf_port, run_root, out / "inference.log")
    launcher = subprocess.Popen(
        [args.rl, "rl", "@", str(args.config), "--no-inference", "--clean",
         "--output-dir", str(out), "--run.name", "soak", "--model.path", str(model), "--max-steps", str(args.max_steps),
         "--orchestrator.model.base-url", f"http://127.0.0.1:{proxy_port}/v1", "--ckpt.interval", "10",
         "--orchestrator.eval", "None", "--launcher.max-restarts", str(args.max_restarts)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(launcher.stdout.readline, "")), daemon=True).start()
    start, kills, next_kill, turn = time.time(), {"env": 0, "inference": 0}, time.time() + args.kill_every, 0
    deadline = start + args.minutes * 60
    while launcher.poll() is None and time.time() < deadline:
        time.sleep(1)
        if time.time() >= next_kill:
            next_kill += args.kill_every
            if turn % 2 == 0:
                for pid in pids_naming(str(run_root / "configs/envs/train")):
                    os.kill(pid, signal.SIGKILL)
                    kills["env"] += 1
            else:
                inference.kill()
                inference.wait()
                kills["inference"] += 1
                time.sleep(1)
                inference = start_inference(args.rl, model, inf_port, run_root, out / "inference.log")
            turn += 1
    if launcher.poll() is None:
        launcher.send_signal(signal.SIGINT)  # time is up: stop; the files must still be consistent
    code = launcher.wait()
    (out / "launcher.log").write_text("".join(lines))
    inference.kill()
    proxy.shutdown()
    rows = [json.loads(l) for l in (run_root / "metrics.jsonl").read_text().splitlines() if l.strip()]
    trainer = [json.loads(l) for l in (run_root / "trainer/metrics.jsonl").read_text().splitlines() if l.strip()]
    steps_o, steps_t = [r["step"] for r in rows], [r["step"] for r in trainer]
    summary = {
        "minutes": round((time.time() - start) / 60, 1),
        "launcher_exit": code,
        "steps": len(steps_o),
        "each_step_once": steps_o == list(range(1, len(steps_o) + 1)) and steps_t[: len(steps_o)] == steps_o,
        "kills": kills,
        "launcher_restarts": sum("restarting it" in l for l in lines),
        "launcher_log": str(out / "launcher.log"),
        "injected_faults": proxy.faults,
        "errors_retried": sum(v for r in rows for k, v in r.items() if k.startswith("errors/") and isinstance(v, (int, float))),
        "groups_dropped": sum(v for r in rows for k, v in r.items() if k.startswith("groups_dropped/")),
        "final_model": (run_root / "model" / "model.safetensors").exists(),
        "trained_steps": sum(1 for r in trainer if r.get("rl_tokens", 0) > 0),
        "run_dir": str(run_root),
    }
    print(json.dumps(summary, indent=1))
    return 0 if summary["each_step_once"] else 1


if __name__ == "__main__":
    sys.exit(main())
