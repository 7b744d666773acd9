"""Rubrics: reward functions with weights, and zero-weight metrics.

A reward function names the arguments it wants, as in verifiers: any of `completion` (the messages
after the prompt), `prompt`, `messages` (all of them), `answer`, `info`, `task` (the dataset row),
`state`, `training_context` (the request's step, policy version, ...; None without one) and
`models` (the request's extra models by key, as `rl_env.Model`, for LLM judges); a `**kwargs`
parameter receives them all. It may be `async`. It returns a number (bool counts as 0/1); anything
else, an exception or a timeout becomes a reward error on the trace and scores 0.
"""

import asyncio
import inspect
import math

from .runner import call_user


class RewardError(Exception):
    """A reward function failed; the message says which and why."""


class Rubric:
    """Weighted reward functions; weight 0 makes a function a metric (reported, not rewarded)."""

    def __init__(self, funcs=(), weights=None, timeout_s=60.0):
        self._funcs = {}
        self.timeout_s = float(timeout_s)
        funcs = list(funcs)
        weights = [1.0] * len(funcs) if weights is None else list(weights)
        if len(weights) != len(funcs):
            raise ValueError(f"Rubric got {len(funcs)} functions but {len(weights)} weights")
        for f, w in zip(funcs, weights):
            self.add_reward_func(f, w)

    def add_reward_func(self, func, weight=1.0):
        """Adds a reward function; its name in metrics is the function's `__name__`."""
        if not callable(func):
            raise TypeError(f"reward functions must be callable, got {type(func).__name__}")
        name = getattr(func, "__name__", None) or type(func).__name__
        if name in self._funcs:
            raise ValueError(f"two reward functions are named {name!r}; names must be unique")
        weight = float(weight)
        if not math.isfinite(weight):
            raise ValueError(f"reward function {name!r} has a non-finite weight")
        self._funcs[name] = (func, weight)
        return self

    def add_metric(self, func):
        """Adds a zero-weight function: recorded under `metrics`, not part of the reward."""
        return self.add_reward_func(func, 0.0)

    def describe(self):
        """Names and weights, in order."""
        return [{"name": n, "weight": w} for n, (_, w) in self._funcs.items()]

    async def score(self, name, kwargs):
        """Runs one function; returns its value or raises RewardError."""
        entry = self._funcs.get(name)
        if entry is None:
            raise RewardError(f"no reward function named {name!r}")
        func = entry[0]
        try:
            value = await call_user(func, kwargs, self.timeout_s)
        except asyncio.TimeoutError:
            raise RewardError(f"{name} did not return within {self.timeout_s:g} s") from None
        except Exception as e:  # the user's code: any failure is this rollout's reward error
            raise RewardError(f"{name} raised {type(e).__name__}: {e}") from None
        if isinstance(value, bool):
            return float(value)
        if not isinstance(value, (int, float)) or inspect.isawaitable(value):
            raise RewardError(f"{name} returned {type(value).__name__} {value!r:.80}, expected a number")
        value = float(value)
        if not math.isfinite(value):
            raise RewardError(f"{name} returned a non-finite value {value}")
        return value
