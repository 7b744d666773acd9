"""An infinite verifiers v1 taskset written for these tests: `rlt_reverse`'s task, generated
forever (as a taskset drawing fresh tasks from a generator is)."""

import itertools
import random

import verifiers.v1 as vf
from rlt_reverse import ReverseData, ReverseTask


class EndlessConfig(vf.TasksetConfig):
    seed: int = 0


class EndlessTaskset(vf.Taskset[ReverseTask, EndlessConfig]):
    INFINITE = True

    def load(self):
        rng = random.Random(self.config.seed)
        for _ in itertools.count():
            text = "".join(rng.choice("abcdefgh") for _ in range(rng.randint(3, 6)))
            yield ReverseTask(ReverseData(prompt=f"Reverse: {text}", text=text), self.config.task)


__all__ = ["EndlessTaskset"]
