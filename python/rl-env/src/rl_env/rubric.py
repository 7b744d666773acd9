"""Rubrics: reward functions with weights, and zero-weight metrics.

A reward function names the arguments it wants, as in verifiers: any of `completion` (the messages
after the prompt), `prompt`, `messages` (all of them), `answer`, `info`, `task` (the dataset row),
`state`, `training_context` (the request's step, policy version, ...; None without one) and
`models` (the request's extra models by key, as `rl_env.Model`, for LLM judges); a `**kwargs`
parameter receives them all. It may be `async`. It returns a number (bool counts as 0/1); anything
else, an exception or a timeout becomes a reward error on the trace and scores 0.

A function added with `per_turn=True` scores each model turn of a multi-turn episode: it returns a
list of numbers, one per turn. Its reward component is their mean, and the weighted turn scores
become the trace's `turn_rewards`, which `grpo` with `credit = "turn"` credits turn by turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Iterable, Mapping
from typing import Any, Callable, Optional, Union

from .runner import POOL, accepted_names, is_async, wanted_kwargs

RewardFunc = Callable[..., Any]
"""A reward function: named arguments in, a number (or, per turn, a list of numbers) out."""

Score = Union[float, list[float]]
"""A reward function's value: a number, or a per-turn function's list of turn scores."""

Outcome = tuple[Optional[Score], Optional[str]]
"""`(value, None)` or `(None, error message)`."""

# (function, weight, accepted argument names, is async, per turn)
_Entry = tuple[RewardFunc, float, Optional[frozenset[str]], bool, bool]


class RewardError(Exception):
    """A reward function failed; the message says which and why."""


class Rubric:
    """Weighted reward functions; weight 0 makes a function a metric (reported, not rewarded)."""

    def __init__(
        self,
        funcs: Iterable[RewardFunc] = (),
        weights: Iterable[float] | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        self._funcs: dict[str, _Entry] = {}
        self.timeout_s = float(timeout_s)
        func_list = list(funcs)
        weight_list = [1.0] * len(func_list) if weights is None else list(weights)
        if len(weight_list) != len(func_list):
            raise ValueError(f"Rubric got {len(func_list)} functions but {len(weight_list)} weights")
        for f, w in zip(func_list, weight_list):
            self.add_reward_func(f, w)

    def add_reward_func(self, func: RewardFunc, weight: float = 1.0, per_turn: bool = False) -> Rubric:
        """Adds a reward function; its name in metrics is the function's `__name__`. With
        `per_turn=True` it returns one score per model turn (see the module doc)."""
        if not callable(func):
            raise TypeError(f"reward functions must be callable, got {type(func).__name__}")
        name = getattr(func, "__name__", None) or type(func).__name__
        if name in self._funcs:
            raise ValueError(f"two reward functions are named {name!r}; names must be unique")
        w = float(weight)
        if not math.isfinite(w):
            raise ValueError(f"reward function {name!r} has a non-finite weight")
        self._funcs[name] = (func, w, accepted_names(func), is_async(func), bool(per_turn))
        return self

    def add_metric(self, func: RewardFunc) -> Rubric:
        """Adds a zero-weight function: recorded under `metrics`, not part of the reward."""
        return self.add_reward_func(func, 0.0)

    def describe(self) -> list[dict[str, Any]]:
        """Names and weights, in order."""
        return [
            {"name": n, "weight": w, **({"per_turn": True} if t else {})} for n, (_, w, _, _, t) in self._funcs.items()
        ]

    async def score(self, name: str, kwargs: Mapping[str, Any]) -> Score | None:
        """Runs one function; returns its value or raises RewardError."""
        value, error = (await self.score_all([name], kwargs))[0]
        if error is not None:
            raise RewardError(error)
        return value

    async def score_all(self, names: list[str], kwargs: Mapping[str, Any]) -> list[Outcome]:
        """Runs the named functions on one rollout: `[(value, None) | (None, error message)]`; a
        per-turn function's value is its list of turn scores.

        Async functions run concurrently, each with the timeout; sync ones run one after another in
        one worker thread (a single hand-off per rollout), sharing the timeout; a sync function
        still running when it expires keeps its thread, and it and the ones after it time out.
        """
        results: dict[str, Outcome] = {}
        sync: list[tuple[str, _Entry]] = []
        pending: list[Awaitable[None]] = []
        for name in names:
            entry = self._funcs.get(name)
            if entry is None:
                results[name] = (None, f"no reward function named {name!r}")
            elif entry[3]:
                pending.append(self._run_async(name, entry, kwargs, results))
            else:
                sync.append((name, entry))
        if sync:
            pending.append(self._run_sync(sync, kwargs, results))
        if len(pending) == 1:
            await pending[0]
        elif pending:
            await asyncio.gather(*pending)
        return [results[n] for n in names]

    async def _run_async(
        self, name: str, entry: _Entry, kwargs: Mapping[str, Any], results: dict[str, Outcome]
    ) -> None:
        func, _, accepted, _, per_turn = entry
        try:
            value = await asyncio.wait_for(func(**wanted_kwargs(func, kwargs, accepted)), self.timeout_s)
            results[name] = checked_turns(name, value) if per_turn else checked(name, value)
        except asyncio.TimeoutError:
            results[name] = (None, f"{name} did not return within {self.timeout_s:g} s")
        except Exception as e:  # the user's code: any failure is this rollout's reward error
            results[name] = (None, f"{name} raised {type(e).__name__}: {e}")

    async def _run_sync(
        self, entries: list[tuple[str, _Entry]], kwargs: Mapping[str, Any], results: dict[str, Outcome]
    ) -> None:
        done: dict[str, Outcome] = {}

        def run_all() -> None:
            for name, (func, _, accepted, _, per_turn) in entries:
                try:
                    value = func(**wanted_kwargs(func, kwargs, accepted))
                    done[name] = checked_turns(name, value) if per_turn else checked(name, value)
                except Exception as e:  # the user's code: any failure is this rollout's reward error
                    done[name] = (None, f"{name} raised {type(e).__name__}: {e}")

        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(POOL, run_all), self.timeout_s)
        for name, _ in entries:
            results[name] = done.get(name) or (None, f"{name} did not return within {self.timeout_s:g} s")


def checked(name: str, value: Any) -> tuple[float | None, str | None]:
    """(value, None) for a finite number (bool counts as 0/1), else (None, why not)."""
    if isinstance(value, bool):
        return float(value), None
    if not isinstance(value, (int, float)):
        return None, f"{name} returned {type(value).__name__} {value!r:.80}, expected a number"
    number = float(value)
    if not math.isfinite(number):
        return None, f"{name} returned a non-finite value {number}"
    return number, None


def checked_turns(name: str, value: Any) -> tuple[list[float] | None, str | None]:
    """(list of floats, None) for a list or tuple of finite numbers, else (None, why not)."""
    if not isinstance(value, (list, tuple)):
        return None, f"{name} returned {type(value).__name__} {value!r:.80}, expected a list of numbers (per_turn)"
    out: list[float] = []
    for i, v in enumerate(value):
        number, error = checked(f"{name} turn {i}", v)
        if number is None:
            return None, error
        out.append(number)
    return out, None
