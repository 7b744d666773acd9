"""A small verifiers v1 taskset written for these tests: reverse a short string (single turn)."""

import random

import verifiers.v1 as vf


class ReverseData(vf.TaskData):
    text: str


class ReverseConfig(vf.TasksetConfig):
    num_tasks: int = 64
    seed: int = 0


def overlap(a: str, b: str) -> float:
    """Share of positions where two strings agree, over the longer one."""
    if not a and not b:
        return 1.0
    same = sum(x == y for x, y in zip(a, b))
    return same / max(len(a), len(b))


class ReverseTask(vf.Task[ReverseData]):
    @vf.reward(weight=1.0)
    async def reversal(self, task: ReverseData, trace: vf.Trace) -> float:
        return overlap(trace.last_reply.strip(), task.text[::-1])

    @vf.reward(weight=0.5)
    async def length(self, task: ReverseData, trace: vf.Trace) -> float:
        """How close the reply's length is to the text's (a signal even a random model varies on)."""
        return max(0.0, 1.0 - abs(len(trace.last_reply.strip()) - len(task.text)) / 8)

    @vf.reward(weight=0.0)
    async def exact(self, task: ReverseData, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == task.text[::-1])

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class ReverseTaskset(vf.Taskset[ReverseTask, ReverseConfig]):
    def load(self):
        rng = random.Random(self.config.seed)
        for _ in range(self.config.num_tasks):
            text = "".join(rng.choice("abcdefgh") for _ in range(rng.randint(3, 6)))
            yield ReverseTask(ReverseData(prompt=f"Reverse: {text}", text=text), self.config.task)


__all__ = ["ReverseTaskset"]
