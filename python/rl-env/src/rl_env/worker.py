"""The pipe protocol between `rl env-server` (env id `python`) and a Python environment.

The server starts `python -m rl_env.worker (--file PATH | --module NAME) [--args JSON]`, which
imports the user's code, calls its `load_environment(**args)`, and writes one JSON line on stdout:
`{"event": "ready", "env": {...}}` (id, splits with their rows, tools, max_turns, rubric, metadata)
or `{"event": "error", "message": ...}`. Then it answers requests, one JSON object per line, any
number in flight: `{"id": N, "method": M, "params": {...}}` -> `{"id": N, "result": ...}` or
`{"id": N, "error": {"kind": "env" | "reward" | "bad_request", "message": ...}}`. Methods:
`prompt`, `env_response`, `score` (every rubric function, or those named, in one call),
`algorithm` (an env-owned advantage algorithm on a group), `ping`. The user's prints go to stderr,
never into the protocol.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import json
import math
import os
import sys
import threading
import traceback
from collections.abc import Mapping
from typing import IO, Any, NoReturn

from .data import DatasetError
from .env import EnvError, Environment, State
from .messages import Messages, check_messages
from .models import Model
from .rubric import RewardError

PROTOCOL_VERSION = 1

# Keys of `state` filled from the task on every call; they are not sent back to the host.
SUPPLIED_STATE = ("turn", "task", "answer", "info")


Params = dict[str, Any]
"""A request's `params` (JSON)."""

Answer = dict[str, Any]
"""A request's `result` (JSON)."""


class BadRequest(Exception):
    """The host sent something this worker cannot use."""


def result_json(value: Any, error: str | None) -> dict[str, Any]:
    """One function's result on the wire: `value`, `turns` (a per-turn function) or `error`."""
    if error is not None:
        return {"error": error}
    return {"turns": value} if isinstance(value, list) else {"value": value}


def load_user_environment(
    file: str | None = None, module: str | None = None, args: Mapping[str, Any] | None = None
) -> Environment:
    """Imports the user's module and builds its environment with `load_environment(**args)`."""
    if file:
        path = os.path.abspath(file)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{file}: no such file")
        sys.path.insert(0, os.path.dirname(path))
        name = os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"{file}: cannot be imported as a module")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        where = file
    elif module:
        mod = importlib.import_module(module)
        where = module
    else:
        raise ValueError("give the environment's file or module")
    factory = getattr(mod, "load_environment", None)
    if not callable(factory):
        raise AttributeError(f"{where} defines no load_environment(**args) function")
    env = factory(**(args or {}))
    if not isinstance(env, Environment):
        raise TypeError(f"{where}: load_environment returned {type(env).__name__}, expected an rl_env.Environment")
    return env


class LineServer:
    """One JSON request per line in, one answer per line out; `do_<method>` handles a method."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out

    def write(self, obj: dict[str, Any]) -> None:
        try:
            line = json.dumps(obj, allow_nan=False, ensure_ascii=False)
        except (TypeError, ValueError) as e:
            line = json.dumps(
                {"id": obj.get("id"), "error": {"kind": "env", "message": f"the answer is not JSON-serializable: {e}"}}
            )
        self.out.write(line + "\n")
        self.out.flush()

    async def handle(self, raw: str | bytes) -> None:
        try:
            request = json.loads(raw)
            rid = request["id"]
            method = request["method"]
            params = request.get("params") or {}
        except (ValueError, KeyError, TypeError) as e:
            self.write({"id": None, "error": {"kind": "bad_request", "message": f"unreadable request: {e}"}})
            return
        try:
            handler = getattr(self, "do_" + method, None)
            if handler is None:
                raise BadRequest(f"unknown method {method!r}")
            result = await handler(params)
            self.write({"id": rid, "result": result})
        except RewardError as e:
            self.write({"id": rid, "error": {"kind": "reward", "message": str(e)}})
        except BadRequest as e:
            self.write({"id": rid, "error": {"kind": "bad_request", "message": str(e)}})
        except (EnvError, DatasetError) as e:
            self.write({"id": rid, "error": {"kind": "env", "message": str(e)}})
        except Exception as e:  # a bug in the user's env: this episode's env error, never the worker's end
            tb = traceback.format_exc(limit=-3)
            print(f"rl_env: {method} failed:\n{tb}", file=sys.stderr, flush=True)
            self.write({"id": rid, "error": {"kind": "env", "message": f"{method}: {type(e).__name__}: {e}"}})

    async def do_ping(self, params: Params) -> Answer:
        return {}


class Worker(LineServer):
    """Answers the host's requests for one `rl_env` environment."""

    def __init__(self, env: Environment, out: IO[str]) -> None:
        super().__init__(out)
        self.env = env

    async def do_prompt(self, params: Params) -> Answer:
        return {"messages": check_messages(self.env.format_prompt(params["task"]), "format_prompt()")}

    def episode_state(self, params: Params) -> State:
        """The state dict user code sees: what it kept, plus the task's fields (not sent back)."""
        task = params["task"]
        state = dict(params.get("state") or {})
        state.update(turn=params.get("turn", 0), task=task, answer=self.env.answer_of(task), info=task.get("info", {}))
        return state

    @staticmethod
    def kept(state: Any) -> State:
        if not isinstance(state, dict):
            raise EnvError(f"env_response returned a state of type {type(state).__name__}, expected a dict")
        return {k: v for k, v in state.items() if k not in SUPPLIED_STATE}

    async def do_env_response(self, params: Params) -> Answer:
        messages: Messages = params["messages"]
        state = self.episode_state(params)
        if self.env.is_completed(messages, state):
            return {"done": True, "messages": [], "state": self.kept(state)}
        # User code may return a single message dict too.
        reply: Any = await self.env.env_response(messages, state)
        if isinstance(reply, tuple) and len(reply) == 2:
            reply, state = reply
        if reply is None:
            return {"done": True, "messages": [], "state": self.kept(state)}
        if isinstance(reply, dict):
            reply = [reply]
        return {"done": False, "messages": check_messages(reply, "env_response()"), "state": self.kept(state)}

    async def do_score(self, params: Params) -> Answer:
        """Scores one rollout with the named functions (all when `functions` is absent), concurrently."""
        task = params["task"]
        messages = params["messages"]
        prompt = self.env.format_prompt(task)
        models = {
            m["key"]: Model(m["base_url"], m["model"], m.get("sampling"), m.get("timeout_s"))
            for m in params.get("models") or []
        }
        available = {
            "prompt": prompt,
            "completion": messages[len(prompt) :],
            "messages": messages,
            "answer": self.env.answer_of(task),
            "info": task.get("info", {}),
            "task": task,
            "state": self.episode_state(params),
            "training_context": params.get("training_context"),
            "models": models,
        }
        names = params.get("functions")
        if names is None:
            names = [f["name"] for f in self.env.rubric.describe()]

        scored = await self.env.rubric.score_all(names, available)
        return {"results": [result_json(v, e) for v, e in scored]}

    async def do_algorithm(self, params: Params) -> Answer:
        """One env-owned algorithm on a group: one advantage (or None) per trace."""
        name = params["name"]
        func = self.env.algorithms.get(name)
        if func is None:
            raise BadRequest(f"this env has no algorithm {name!r}")
        traces = params["traces"]
        result = func(traces, params.get("fields") or {})
        if asyncio.iscoroutine(result):
            result = await result
        if not isinstance(result, (list, tuple)) or len(result) != len(traces):
            raise EnvError(f"algorithm {name} must return a list of {len(traces)} numbers or None, got {result!r:.100}")
        out: list[float | None] = []
        for i, value in enumerate(result):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            ):
                raise EnvError(
                    f"algorithm {name}: the value for trace {i} is {value!r}, expected a finite number or None"
                )
            out.append(None if value is None else float(value))
        return {"advantages": out}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl_env.worker", description=(__doc__ or "").splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--file", help="a .py file defining load_environment(**args)")
    source.add_argument("--module", help="an importable module defining load_environment(**args)")
    parser.add_argument("--args", default="{}", help="JSON object of keyword arguments for load_environment")
    opts = parser.parse_args(argv)

    out = protocol_stdout()

    try:
        args = json.loads(opts.args)
        if not isinstance(args, dict):
            raise ValueError("--args must be a JSON object")
        env = load_user_environment(opts.file, opts.module, args)
        ready = {"event": "ready", "protocol": PROTOCOL_VERSION, "env": env.describe()}
        line = json.dumps(ready, allow_nan=False, ensure_ascii=False)
    except Exception as e:
        traceback.print_exc(file=sys.stderr)
        out.write(json.dumps({"event": "error", "message": f"{type(e).__name__}: {e}"}) + "\n")
        out.flush()
        return 1
    out.write(line + "\n")
    out.flush()
    serve(Worker(env, out))


def protocol_stdout() -> IO[str]:
    """The real stdout, for the protocol alone; everything user code prints goes to stderr."""
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def serve(server: LineServer, loop: asyncio.AbstractEventLoop | None = None) -> NoReturn:
    """Answers requests read from stdin until the host closes it, then exits the process."""
    if loop is None:
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    done = asyncio.Event()
    tasks: set[asyncio.Task[None]] = set()

    def dispatch(raw: bytes) -> None:
        task = loop.create_task(server.handle(raw))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def read_stdin() -> None:
        for raw in sys.stdin.buffer:
            loop.call_soon_threadsafe(dispatch, raw)
        loop.call_soon_threadsafe(done.set)

    threading.Thread(target=read_stdin, name="rl-env-stdin", daemon=True).start()
    loop.run_until_complete(done.wait())
    # The host closed the pipe: it is gone or shutting down, and nothing can receive answers any
    # more. Exit at once: a user function that hangs in a thread must not keep the process alive.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
