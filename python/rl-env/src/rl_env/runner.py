"""Calling user functions: the keyword arguments they accept, async or on a worker thread, with a timeout."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
from collections.abc import Mapping
from typing import Any, Callable

# Sync user functions run here so a slow one never blocks other rollouts. A function that hangs
# keeps its thread; the pool is large so a few of those do not starve the rest.
POOL = concurrent.futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix="rl-env-user")


class _NotGiven:
    """`wanted_kwargs` was not told the names: it looks them up."""


def accepted_names(func: Callable[..., Any]) -> frozenset[str] | None:
    """The keyword arguments `func` accepts, or None when it takes **kwargs (everything)."""
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def wanted_kwargs(
    func: Callable[..., Any],
    available: Mapping[str, Any],
    names: frozenset[str] | _NotGiven | None = _NotGiven(),  # noqa: B008 (an immutable sentinel)
) -> dict[str, Any]:
    """The subset of `available` that `func` accepts (`names` from `accepted_names`, if known)."""
    if isinstance(names, _NotGiven):
        names = accepted_names(func)
    if names is None:
        return dict(available)
    return {k: v for k, v in available.items() if k in names}


def is_async(func: Any) -> bool:
    # An object whose `__call__` is a coroutine function is async too (not a callability test).
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None))  # noqa: B004


async def call_exact(func: Callable[..., Any], kwargs: Mapping[str, Any], timeout_s: float) -> Any:
    """Calls `func(**kwargs)` (a tool: the model chose the arguments); raises asyncio.TimeoutError."""
    if is_async(func):
        return await asyncio.wait_for(func(**kwargs), timeout_s)
    loop = asyncio.get_running_loop()
    result = await asyncio.wait_for(loop.run_in_executor(POOL, functools.partial(func, **kwargs)), timeout_s)
    if inspect.isawaitable(result):
        result = await asyncio.wait_for(result, timeout_s)
    return result
