"""Experiment tracking for `rl rl`: a sidecar the launcher starts when the config has `[wandb]`.

It follows the files the Rust processes write (the orchestrator's and the trainer's metrics, each
step's traces; their paths come in the settings' `paths`, from the run directory's one owner,
Rust's `RunDir`) and sends each step to Weights & Biases
once both the orchestrator's and the trainer's rows of that step exist (so W&B's step axis only
grows), with the run's resolved config, and a table of samples every `samples_every` steps. For
`rl sft` (`"single": true` in the settings) it sends each row of `metrics.jsonl` as it comes.
Nothing in the training processes waits for it. Resuming the run resumes the W&B run (its id and
the last step sent are kept in `state.json` of the settings' `dir`).

    python -m rl_env.tracking --run-dir RUN --settings JSON [--once]

`--once` sends what is there and finishes (tests, and the launcher's last flush); otherwise it
follows the files until SIGTERM or until its parent process exits, then sends the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

POLL_S = 1.0
SAMPLE_ROWS = 16


class Follower:
    """New complete JSON lines of a file, as they are appended (a torn last line waits)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def rows(self) -> Iterator[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n")
        if end < 0:
            return
        self.offset += end + 1
        for line in data[: end + 1].splitlines():
            if line.strip():
                yield json.loads(line)


def flatten(row: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"reward": {"mean": 1}}` -> `{"reward/mean": 1}` (metrics.jsonl rows nest some groups)."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "/"))
        elif isinstance(value, bool):
            out[name] = int(value)
        elif isinstance(value, (int, float)):
            out[name] = value
    return out


def samples(traces_template: str, step: int) -> list[list[Any]]:
    """Rows (step, env, prompt, completion, reward) from the step's traces (the file named by
    `traces_template` with `{step}` replaced)."""
    path = Path(traces_template.replace("{step}", str(step)))
    rows: list[list[Any]] = []
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return rows
    for line in lines[:SAMPLE_ROWS]:
        trace = json.loads(line)
        messages = trace.get("messages", [])
        last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
        if last is None:
            continue
        prompt = "\n".join(f"{m['role']}: {m.get('content', '')}" for m in messages[:last])
        rows.append([step, trace.get("env", ""), prompt, messages[last].get("content", ""), trace.get("reward", 0.0)])
    return rows


class Tracker:
    """Merges the two metrics files by step and sends finished steps in order."""

    def __init__(self, run_dir: Path, settings: dict[str, Any], wandb_module: Any) -> None:
        self.run_dir = run_dir
        self.settings = settings
        self.wandb = wandb_module
        self.paths: dict[str, str] = settings["paths"]
        self.orchestrator = Follower(Path(self.paths["metrics"]))
        self.trainer = Follower(Path(self.paths["trainer_metrics"]))
        self.pending_orch: dict[int, dict[str, Any]] = {}
        self.pending_trainer: dict[int, dict[str, Any]] = {}
        self.state_path = Path(settings["dir"]) / "state.json"
        state = self._load_state()
        self.sent = state.get("logged_step", -1)
        # `single`: one metrics file (`rl sft`), each row sent as it arrives.
        self.single = bool(settings.get("single"))
        config_path = Path(self.paths["config"])
        config: dict[str, Any] = json.loads(config_path.read_text()) if config_path.exists() else {}
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        self.run = wandb_module.init(
            project=settings["project"],
            entity=settings.get("entity"),
            name=settings.get("name") or run_dir.name,
            group=settings.get("group"),
            tags=settings.get("tags") or None,
            mode=settings.get("mode", "online"),
            dir=str(self.state_path.parent),
            config=config,
            id=state.get("id"),
            resume="allow",
        )
        self._save_state()

    def _load_state(self) -> dict[str, Any]:
        try:
            state = json.loads(self.state_path.read_text())
        except (FileNotFoundError, ValueError):
            return {}
        return state if isinstance(state, dict) else {}

    def _save_state(self) -> None:
        # Whole file or nothing: a temp file in the same directory, fsync, rename.
        data = json.dumps({"id": self.run.id, "logged_step": self.sent})
        fd, tmp = tempfile.mkstemp(dir=self.state_path.parent, prefix=".state.")
        with os.fdopen(fd, "w") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.state_path)

    def poll(self, final: bool = False) -> int:
        """Reads new rows and sends every step that is complete (all of them when `final`)."""
        for row in self.orchestrator.rows():
            self.pending_orch[int(row["step"])] = row
        if not self.single:
            for row in self.trainer.rows():
                self.pending_trainer[int(row["step"])] = row
        sent = 0
        for step in sorted(self.pending_orch):
            # Step 0 (an evaluation before training) has no trainer row.
            if not final and not self.single and step > 0 and step not in self.pending_trainer:
                break
            self._send(step, self.pending_orch.pop(step), self.pending_trainer.pop(step, None))
            sent += 1
        if final:
            for step in sorted(self.pending_trainer):
                self._send(step, None, self.pending_trainer.pop(step))
                sent += 1
        if sent:
            self._save_state()
        return sent

    def _send(self, step: int, orch: dict[str, Any] | None, trainer: dict[str, Any] | None) -> None:
        if step <= self.sent:
            return  # sent before a resume
        data: dict[str, Any] = {}
        if orch:
            data.update(flatten({k: v for k, v in orch.items() if k != "step"}))
        if trainer:
            data.update(flatten({k: v for k, v in trainer.items() if k != "step"}, "trainer/"))
        every = int(self.settings.get("samples_every") or 0)
        columns = ["step", "env", "prompt", "completion", "reward"]
        if every and step > 0 and step % every == 0:
            rows = samples(self.paths["traces"], step)
            if rows:
                data["rollout_samples"] = self.wandb.Table(columns=columns, data=rows)
        # Evaluations are sparse already: each one's samples go with it whenever samples are on.
        if every and orch and any(k.startswith("eval/") for k in orch) and "eval_traces" in self.paths:
            rows = samples(self.paths["eval_traces"], step)
            if rows:
                data["eval_samples"] = self.wandb.Table(columns=columns, data=rows)
        self.run.log(data, step=step)
        self.sent = step

    def finish(self) -> None:
        self.poll(final=True)
        self.run.finish()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument(
        "--settings", required=True, help="the [wandb] section as JSON, with `dir` and the run's `paths`"
    )
    parser.add_argument("--once", action="store_true", help="send what is there, then finish")
    args = parser.parse_args(argv)
    # First thing: a SIGTERM that arrives while W&B starts must still end in a flush.
    stop = {"now": args.once}
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    try:
        import wandb
    except ImportError:
        print(
            "rl_env.tracking: the `wandb` package is not installed in this Python "
            f"({sys.executable}); install it with `pip install wandb` or set [wandb] python",
            file=sys.stderr,
        )
        return 2
    settings = json.loads(args.settings)
    tracker = Tracker(args.run_dir, settings, wandb)
    parent = os.getppid()
    while not stop["now"] and os.getppid() == parent:
        tracker.poll()
        time.sleep(POLL_S)
    tracker.finish()
    # `finish` can return before W&B's service has written the run's last records to disk;
    # stopping the service waits for them, so what this returns having sent is on disk.
    wandb.teardown()
    signal.signal(signal.SIGTERM, previous)
    return 0


if __name__ == "__main__":
    sys.exit(main())
