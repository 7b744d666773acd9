"""A verifiers v1 taskset whose reward raises, written for the failure tests."""

import verifiers.v1 as vf


class BrokenTask(vf.Task[vf.TaskData]):
    @vf.reward
    async def broken(self, trace: vf.Trace) -> float:
        raise RuntimeError("the scorer broke")


class BrokenTaskset(vf.Taskset[BrokenTask, vf.TasksetConfig]):
    def load(self):
        for i in range(4):
            yield BrokenTask(vf.TaskData(prompt=f"Say {i}."), self.config.task)


__all__ = ["BrokenTaskset"]
