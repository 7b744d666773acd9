#!/usr/bin/env python3
"""Per-turn anatomy of alphabet-sort rollouts: mean score and exact rate of each model turn,
split by sort key (FIRST / LAST name), from a run's `rollouts/step_*/traces.jsonl`; then the
first turns by key and number of names, exact rate next to chance. Chance is 1/n!: a model that
orders the names' sort keys right but pairs each with a random one of the other halves (writes
the last names in their own sorted order, say) is exact with that probability, so a rate at chance
means the model has not learned which last name belongs to which first name.

To decode a model near-greedily on fresh episodes without changing it, run two steps at a
learning rate of 1e-12 (the "Where RL's gain goes" table of docs/recipes.md was measured this way):

    rl rl @ configs/alphabet_sort/rl.toml --model.path <model dir> --run.name <name> --clean \
      --max-steps 2 --trainer.optim.lr 1e-12 --trainer.scheduler.min-lr 1e-12 \
      --trainer.scheduler.warmup-steps 0 --trainer.scheduler.decay-steps 0 \
      --orchestrator.batch-size 128 --orchestrator.group-size 2 --orchestrator.max-async-level 0 \
      --orchestrator.train.sampling.temperature 0.05 --orchestrator.eval.eval-on-start false \
      --orchestrator.train.env '[{"id": "alphabet-sort", "args": {"num_examples": 50000, "min_turns": 1,
        "max_turns": 3, "min_names": 2, "max_names": 4, "seed": 11}}]'
    python3 scripts/alphabet_sort_turns.py outputs/<name>

Usage: alphabet_sort_turns.py RUN_DIR [FIRST_STEP LAST_STEP]
"""

import collections
import json
import math
import pathlib
import re
import sys


def main() -> int:
    if len(sys.argv) not in (2, 4):
        print(__doc__, file=sys.stderr)
        return 2
    run = pathlib.Path(sys.argv[1])
    lo, hi = (int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) == 4 else (0, 1 << 62)
    files = sorted(run.glob("rollouts/step_*/traces.jsonl"))
    files = [f for f in files if lo <= int(f.parent.name.removeprefix("step_")) <= hi]
    if not files:
        print(f"no traces under {run}/rollouts in steps {lo}..{hi}", file=sys.stderr)
        return 1
    turns: dict[tuple[int, str], list[float]] = collections.defaultdict(list)
    episodes: list[float] = []
    first_turns: dict[tuple[str, int], list[float]] = collections.defaultdict(list)
    for path in files:
        for line_no, line in enumerate(path.read_text().splitlines(), 1):
            trace = json.loads(line)
            users = [m["content"] for m in trace["messages"] if m["role"] == "user"]
            if not users or "alphabetical order by" not in users[0]:
                print(f"{path}:{line_no}: not an alphabet-sort episode", file=sys.stderr)
                return 1
            key = "FIRST" if "by FIRST name" in users[0] else "LAST"
            scores = trace.get("turn_rewards") or [trace["reward"]]
            # With gold history the model answers the last turns only.
            first = len(users) - len(scores) if len(users) >= len(scores) else 0
            for k, score in enumerate(scores):
                turns[(first + k + 1, key)].append(score)
            listed = re.search(r"name: (.*)\n", users[0])
            if first == 0 and listed:
                first_turns[(key, len(listed.group(1).split(", ")))].append(scores[0])
            episodes.append(trace["reward"])
    print(f"{len(episodes)} episodes, mean reward {sum(episodes) / len(episodes):.3f}")
    print("turn  key    n     mean   exact")
    for (turn, key), v in sorted(turns.items()):
        exact = sum(x >= 0.999 for x in v) / len(v)
        print(f"{turn:>4}  {key:<5} {len(v):>5}  {sum(v) / len(v):.3f}  {exact:.2f}")
    print("first turns: key  names      n   exact  chance")
    for (key, names), v in sorted(first_turns.items()):
        exact = sum(x >= 0.999 for x in v) / len(v)
        print(f"             {key:<5} {names:>4}  {len(v):>5}   {exact:.2f}   {1 / math.factorial(names):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
