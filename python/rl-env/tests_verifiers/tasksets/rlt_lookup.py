"""A small verifiers v1 taskset with a tool, written for these tests: look a word's code up."""

import random

import verifiers.v1 as vf

CODES = {
    word: f"{i * 7 % 10}{i * 3 % 10}" for i, word in enumerate(["apple", "brick", "cloud", "delta", "ember", "fjord"])
}


class LookupData(vf.TaskData):
    word: str
    code: str


class CodeBook(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = None

    @vf.tool
    async def lookup(self, word: str) -> str:
        """The two-digit code of a word."""
        return CODES.get(word.strip().lower(), "unknown word")


class LookupTask(vf.Task[LookupData]):
    """Its tool server starts with each rollout (`Task.toolsets`)."""

    @classmethod
    def toolsets(cls, config):
        return [CodeBook(vf.ToolsetConfig())]

    @vf.reward(weight=1.0)
    async def answered(self, task: LookupData, trace: vf.Trace) -> float:
        return float(task.code in trace.last_reply)

    @vf.reward(weight=0.5)
    async def used_tool(self, trace: vf.Trace) -> float:
        return float(len(trace.tool_messages) > 0)

    @vf.reward(weight=0.1)
    async def brevity(self, trace: vf.Trace) -> float:
        """Shorter final replies score higher (a signal a random test model varies on)."""
        return max(0.0, 1.0 - len(trace.last_reply) / 16)

    @vf.metric
    async def turns(self, trace: vf.Trace) -> float:
        return float(trace.num_turns)


class SharedLookupTask(LookupTask):
    """Launches no server of its own: the taskset's shared one answers (`Taskset.toolsets`)."""

    @classmethod
    def toolsets(cls, config):
        return []


class LookupConfig(vf.TasksetConfig):
    num_tasks: int = 32
    seed: int = 0
    # Both of verifiers' tool scopes: one server per rollout (false), or one per environment
    # worker that every rollout calls (true; a stateless tool's usual shape, and one server start
    # instead of one per episode).
    shared_tools: bool = False


class LookupTaskset(vf.Taskset[LookupTask, LookupConfig]):
    @classmethod
    def toolsets(cls, config):
        return [CodeBook(vf.ToolsetConfig())] if config.shared_tools else []

    def load(self):
        rng = random.Random(self.config.seed)
        words = sorted(CODES)
        task = SharedLookupTask if self.config.shared_tools else LookupTask
        for _ in range(self.config.num_tasks):
            word = rng.choice(words)
            prompt = f"Use the lookup tool to find the code of {word!r}, then answer with the code."
            yield task(LookupData(prompt=prompt, word=word, code=CODES[word]), self.config.task)


__all__ = ["LookupTaskset"]

if __name__ == "__main__":
    # verifiers starts a task's tool server as `python -m <the Toolset's module>`.
    CodeBook.run()
