"""The W&B sidecar (`rl_env.tracking`) in offline mode: steps merged from both metrics files,
sent in order, samples tables, and a resumed run continuing the same W&B run."""

import glob
import json
import os
import struct
import tempfile
import unittest
from pathlib import Path

from wandb.proto import wandb_internal_pb2

from rl_env import tracking


def history(wandb_dir: Path):
    """(step, {key: value_json}) of every history record in the offline runs under `wandb_dir`."""
    out = []
    for record in records(wandb_dir, "history"):
        items = {i.key or "/".join(i.nested_key): i.value_json for i in record.history.item}
        out.append((int(items["_step"]), items))
    return out


def records(wandb_dir: Path, record_type: str):
    """The protobuf records of one kind in the offline runs under `wandb_dir` (the .wandb file is a
    LevelDB-style log of protobuf records in 32 KiB blocks)."""
    out = []
    for path in sorted(glob.glob(str(wandb_dir / "wandb" / "offline-run-*" / "run-*.wandb"))):
        data = Path(path).read_bytes()
        pos, chunk, raws = 7, b"", []
        while pos + 7 <= len(data):
            left = 32768 - pos % 32768
            if left < 7:
                pos += left
                continue
            _crc, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
            pos += 7
            if n == 0 and kind == 0:
                break
            chunk += data[pos : pos + n]
            pos += n
            if kind in (1, 4):  # a whole record, or the last piece of one
                raws.append(chunk)
                chunk = b""
        for raw in raws:
            record = wandb_internal_pb2.Record()
            record.ParseFromString(raw)
            if record.WhichOneof("record_type") == record_type:
                out.append(record)
    return out


def write_lines(path: Path, rows, torn: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
        f.write(torn)


def run_paths(run: Path, config: str):
    """The `paths` the launcher passes for a run laid out as Rust's `RunDir` lays it out."""
    return {
        "metrics": str(run / "metrics.jsonl"),
        "trainer_metrics": str(run / "trainer" / "metrics.jsonl"),
        "traces": str(run / "rollouts" / "step_{step}" / "traces.jsonl"),
        "eval_traces": str(run / "evals" / "step_{step}" / "traces.jsonl"),
        "config": str(run / "configs" / config),
    }


class TrackingTest(unittest.TestCase):
    @classmethod
    def tearDownClass(cls):
        # Stop W&B's service now, not in its exit hook (which chokes on unittest's exit status).
        import wandb

        wandb.teardown()

    def test_offline_run_holds_every_step_once_with_samples_and_resumes(self):
        os.environ["WANDB_SILENT"] = "true"
        with tempfile.TemporaryDirectory() as tmp:
            run = Path(tmp) / "my-run"
            (run / "configs").mkdir(parents=True)
            (run / "configs" / "rl.json").write_text(json.dumps({"max_steps": 3, "seq_len": 256}))
            write_lines(
                run / "metrics.jsonl",
                [
                    {"step": 0, "eval/rt/avg@1": 0.25},
                    {"step": 1, "reward/mean": 0.5, "rollouts": {"count": 8}},
                    {"step": 2, "reward/mean": 0.75},
                ],
            )
            # The trainer's step-2 row is being written: step 2 waits for it.
            write_lines(
                run / "trainer" / "metrics.jsonl", [{"step": 1, "loss": 1.5, "optimizer_skipped": False}], '{"st'
            )
            trace = {
                "env": "rt",
                "reward": 1.0,
                "messages": [{"role": "user", "content": "abc"}, {"role": "assistant", "content": "cba"}],
            }
            write_lines(run / "rollouts" / "step_2" / "traces.jsonl", [trace])
            write_lines(run / "evals" / "step_0" / "traces.jsonl", [trace, trace])
            settings = {
                "project": "p",
                "group": "sweep-1",
                "mode": "offline",
                "samples_every": 2,
                "dir": str(run / "wandb"),
                "paths": run_paths(run, "rl.json"),
            }
            argv = ["--run-dir", str(run), "--settings", json.dumps(settings), "--once"]
            self.assertEqual(tracking.main(argv), 0)
            steps = history(run / "wandb")
            self.assertEqual([s for s, _ in steps], [0, 1, 2], "a final flush sends step 2 without its trainer row")
            self.assertEqual({r.run.run_group for r in records(run / "wandb", "run")}, {"sweep-1"})
            first = dict(steps)
            self.assertEqual(json.loads(first[0]["eval/rt/avg@1"]), 0.25)
            self.assertEqual(json.loads(first[1]["trainer/loss"]), 1.5)
            self.assertEqual(json.loads(first[1]["rollouts/count"]), 8)
            self.assertEqual(json.loads(first[2]["rollout_samples/nrows"]), 1, "a samples table at step 2")
            self.assertEqual(json.loads(first[0]["eval_samples/nrows"]), 2, "the step-0 evaluation's samples")
            self.assertNotIn("eval_samples/nrows", first[2], "no evaluation at step 2")
            state = json.loads((run / "wandb" / "state.json").read_text())
            self.assertEqual(state["logged_step"], 2)

            # Resumed: the rest of the trainer's row 2 is not re-sent; step 3 continues the same run.
            with open(run / "trainer" / "metrics.jsonl", "a") as f:
                f.write('ep": 2, "loss": 1.0}\n')
            write_lines(run / "metrics.jsonl", [{"step": 3, "reward/mean": 1.0}])
            write_lines(run / "trainer" / "metrics.jsonl", [{"step": 3, "loss": 0.5}])
            self.assertEqual(tracking.main(argv), 0)
            again = json.loads((run / "wandb" / "state.json").read_text())
            self.assertEqual((again["id"], again["logged_step"]), (state["id"], 3))
            steps = history(run / "wandb")
            self.assertEqual(sorted(s for s, _ in steps), [0, 1, 2, 3], "every step once")

    def test_an_sft_run_sends_each_row_as_it_comes_from_the_paths_it_is_given(self):
        os.environ["WANDB_SILENT"] = "true"
        with tempfile.TemporaryDirectory() as tmp:
            run = Path(tmp) / "sft-run"
            run.mkdir()
            # Files where the settings say, not where a run directory would have them.
            elsewhere = Path(tmp) / "elsewhere"
            elsewhere.mkdir()
            (elsewhere / "the-config.json").write_text(json.dumps({"max_steps": 2}))
            rows = [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.0, "val_loss": 1.5}]
            write_lines(elsewhere / "rows.jsonl", rows)
            paths = {
                "metrics": str(elsewhere / "rows.jsonl"),
                "trainer_metrics": str(elsewhere / "none.jsonl"),
                "traces": str(elsewhere / "{step}.jsonl"),
                "config": str(elsewhere / "the-config.json"),
            }
            settings = {"project": "p", "mode": "offline", "single": True, "dir": str(run / "wandb"), "paths": paths}
            self.assertEqual(tracking.main(["--run-dir", str(run), "--settings", json.dumps(settings), "--once"]), 0)
            steps = dict(history(run / "wandb"))
            self.assertEqual(sorted(steps), [1, 2])
            self.assertEqual(json.loads(steps[2]["val_loss"]), 1.5)

    def test_rows_flatten_into_slash_keys_and_skip_text(self):
        row = {"reward": {"mean": 1.0}, "env": "rt", "ok": True, "n": 3}
        self.assertEqual(
            tracking.flatten(row, "trainer/"), {"trainer/reward/mean": 1.0, "trainer/ok": 1, "trainer/n": 3}
        )


if __name__ == "__main__":
    unittest.main()
