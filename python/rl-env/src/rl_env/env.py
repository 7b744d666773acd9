"""Environments: a dataset, how a row becomes a prompt, replies between model turns, tools, a rubric."""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Iterable, Mapping
from typing import Any, Callable, Optional, Union

from .data import DatasetError, Row, load_dataset, split_rows
from .messages import Message, Messages, check_messages
from .rubric import Rubric
from .runner import call_exact
from .tools import tool_schema

State = dict[str, Any]
"""An episode's own data, kept between turns."""

EnvReply = Union[Messages, tuple[Optional[Messages], State], None]
"""What `env_response` returns: messages, or `(messages, state)` as verifiers does; `None` (or
`(None, state)`) ends the episode."""

Algorithm = Callable[[list[dict[str, Any]], dict[str, Any]], list[Optional[float]]]
"""An env-owned advantage algorithm: a group's traces and the config's fields in, one advantage
(or None) per trace out."""

DatasetSource = Union[None, str, Iterable[Row]]
"""Rows, or a `.jsonl` / `.parquet` path."""


class EnvError(Exception):
    """The environment failed this episode; recorded on the trace as an env error."""


class Environment:
    """Base class. Splits are `train` and `test` (from `eval_dataset`, or `eval_fraction` of `dataset`).

    `algorithms` are advantage algorithms the orchestrator may select for this env (`env-owned`
    in its config, by function name): `f(traces, fields)` gets a group's traces as dicts (`reward`,
    `rewards`, `metrics`, `failed`, `task`, `messages`, `member_id`) and returns one number per
    trace (its advantage on every sampled token) or None for a trace to leave out.

    A row is a dict. Its prompt is its `prompt` field when that is a list of messages, else
    `system_prompt`, then the `few_shot` messages, then a user message with `row[question_key]`.
    Reward functions see `answer` = `row[answer_key]` and `info` = `row["info"]`.
    """

    def __init__(
        self,
        dataset: DatasetSource = None,
        eval_dataset: DatasetSource = None,
        *,
        system_prompt: str | None = None,
        few_shot: Messages | None = None,
        question_key: str = "question",
        answer_key: str = "answer",
        rubric: Rubric | None = None,
        max_turns: int = 1,
        eval_fraction: float = 0.0,
        seed: int = 0,
        env_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        algorithms: Iterable[Algorithm] = (),
    ) -> None:
        rows = load_dataset(dataset)
        evals = load_dataset(eval_dataset)
        if eval_fraction:
            if evals:
                raise DatasetError("give either eval_dataset or eval_fraction, not both")
            rows, evals = split_rows(rows, float(eval_fraction), seed)
        self.system_prompt = system_prompt
        self.few_shot = check_messages(list(few_shot or []), "few_shot")
        self.question_key = question_key
        self.answer_key = answer_key
        self.rubric = rubric if rubric is not None else Rubric()
        if not isinstance(self.rubric, Rubric):
            raise TypeError(f"rubric must be an rl_env.Rubric, got {type(self.rubric).__name__}")
        if not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"max_turns must be an integer >= 1, got {max_turns!r}")
        self.max_turns = max_turns
        self.env_id = env_id or type(self).__name__
        self.metadata = {str(k): str(v) for k, v in (metadata or {}).items()}
        self.splits = {"train": rows, "test": evals}
        self.algorithms: dict[str, Algorithm] = {}
        for f in algorithms:
            name = getattr(f, "__name__", None)
            if not callable(f) or not name:
                raise TypeError(f"algorithms must be named functions, got {f!r}")
            if name in self.algorithms:
                raise ValueError(f"two algorithms are named {name!r}")
            self.algorithms[name] = f
        for split, split_rows_ in self.splits.items():
            for i, row in enumerate(split_rows_):
                self._check_row(split, i, row)

    def _check_row(self, split: str, index: int, row: Row) -> None:
        where = f"{split} row {index}"
        if not isinstance(row.get("prompt"), list) and self.question_key not in row:
            raise DatasetError(
                f"{where}: has no {self.question_key!r} field (nor a `prompt` message list); fields: {sorted(row)}"
            )
        try:
            json.dumps(row)
        except (TypeError, ValueError) as e:
            raise DatasetError(f"{where}: is not JSON-serializable: {e}") from None

    # --- what subclasses may override -------------------------------------------------------

    def format_prompt(self, row: Row) -> Messages:
        """The first messages of an episode for `row`."""
        if isinstance(row.get("prompt"), list):
            return check_messages(row["prompt"], "row.prompt")
        question = row.get(self.question_key)
        if question is None:
            raise EnvError(f"the task has no {self.question_key!r} field")
        messages: Messages = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.extend(self.few_shot)
        messages.append({"role": "user", "content": str(question)})
        return messages

    def tool_functions(self) -> list[Callable[..., Any]]:
        """Plain functions offered to the model as tools."""
        return []

    def is_completed(self, messages: Messages, state: State) -> bool:
        """Whether the episode is over after the model's last turn (checked before `env_response`)."""
        return False

    async def env_response(self, messages: Messages, state: State) -> EnvReply:
        """The messages answering the model's last turn (a list, or `(list, state)` like verifiers);
        `None` (or `(None, state)`) ends the episode there."""
        raise EnvError(f"{type(self).__name__} takes more than one turn but does not define env_response")

    def single_turn(self) -> bool:
        """True when the host need not call `env_response` at all."""
        return self.max_turns == 1 and type(self).env_response is Environment.env_response

    # --- used by the worker ------------------------------------------------------------------

    def answer_of(self, row: Row) -> Any:
        return row.get(self.answer_key)

    def describe(self) -> dict[str, Any]:
        prompts: dict[str, list[Messages]] = {}
        for split, rows in self.splits.items():
            prompts[split] = []
            for i, row in enumerate(rows):
                try:
                    prompts[split].append(check_messages(self.format_prompt(row), "format_prompt()"))
                except Exception as e:
                    raise DatasetError(f"{split} row {i}: cannot format its prompt: {type(e).__name__}: {e}") from None
        return {
            "id": self.env_id,
            "splits": self.splits,
            "prompts": prompts,
            "tools": [tool_schema(f) for f in self.tool_functions()],
            "max_turns": self.max_turns,
            "single_turn": self.single_turn(),
            "rubric": self.rubric.describe(),
            "algorithms": list(self.algorithms),
            "metadata": self.metadata,
        }


class SingleTurnEnv(Environment):
    """One model reply per episode, scored by the rubric."""

    def __init__(self, dataset: DatasetSource = None, eval_dataset: DatasetSource = None, **kwargs: Any) -> None:
        kwargs.setdefault("max_turns", 1)
        super().__init__(dataset, eval_dataset, **kwargs)


class MultiTurnEnv(Environment):
    """Several turns: define `env_response(messages, state)` and, optionally, `is_completed`."""

    def __init__(
        self, dataset: DatasetSource = None, eval_dataset: DatasetSource = None, *, max_turns: int = 10, **kwargs: Any
    ) -> None:
        super().__init__(dataset, eval_dataset, max_turns=max_turns, **kwargs)


class ToolEnv(MultiTurnEnv):
    """The model calls `tools` (plain or async functions); the episode ends at a reply without calls,
    unless `on_plain_reply` is defined: then the environment answers such a reply too (a user
    message such as "try again"), and the episode ends when it returns `None` (or at `max_turns`).

    A tool that raises answers the model with the error text (the model may recover); a tool that
    does not return within `tool_timeout_s` fails the episode with an env error on the trace.
    """

    def __init__(
        self,
        dataset: DatasetSource = None,
        eval_dataset: DatasetSource = None,
        *,
        tools: Iterable[Callable[..., Any]] = (),
        tool_timeout_s: float = 30.0,
        **kwargs: Any,
    ) -> None:
        self.tools: dict[str, Callable[..., Any]] = {}
        for f in tools:
            schema = tool_schema(f)
            if schema["name"] in self.tools:
                raise ValueError(f"two tools are named {schema['name']!r}")
            self.tools[schema["name"]] = f
        self.tool_timeout_s = float(tool_timeout_s)
        super().__init__(dataset, eval_dataset, **kwargs)

    def tool_functions(self) -> list[Callable[..., Any]]:
        return list(self.tools.values())

    def is_completed(self, messages: Messages, state: State) -> bool:
        last: Message = messages[-1] if messages else {}
        plain = last.get("role") == "assistant" and not last.get("tool_calls")
        return plain and type(self).on_plain_reply is ToolEnv.on_plain_reply

    async def on_plain_reply(self, messages: Messages, state: State) -> Messages | None:
        """The environment's answer to a model turn without tool calls: messages to go on with
        (e.g. `[{"role": "user", "content": "Not yet: try again."}]`), or `None` to end the
        episode. Plain or async; the default ends it."""
        return None

    async def call_tool(self, call: dict[str, Any]) -> Message:
        """The tool message answering one call."""
        name = call.get("function", {}).get("name", "")
        call_id = call.get("id", "")
        func = self.tools.get(name)
        if func is None:
            return {
                "role": "tool",
                "tool_call_id": call_id,
                "content": f"Error: unknown tool {name!r}; tools: {', '.join(self.tools)}",
            }
        try:
            args = json.loads(call.get("function", {}).get("arguments") or "{}")
            if not isinstance(args, dict):
                raise ValueError("arguments must be a JSON object")
        except ValueError as e:
            return {"role": "tool", "tool_call_id": call_id, "content": f"Error: bad arguments for {name}: {e}"}
        try:
            result = await call_exact(func, args, self.tool_timeout_s)
        except asyncio.TimeoutError:
            raise EnvError(f"tool {name} did not return within {self.tool_timeout_s:g} s") from None
        except Exception as e:  # the model's call or the tool failed: the model sees why
            return {"role": "tool", "tool_call_id": call_id, "content": f"Error: {type(e).__name__}: {e}"}
        if not isinstance(result, str):
            try:
                result = json.dumps(result)
            except (TypeError, ValueError):
                result = str(result)
        return {"role": "tool", "tool_call_id": call_id, "content": result}

    async def env_response(self, messages: Messages, state: State) -> EnvReply:
        calls = messages[-1].get("tool_calls") or []
        if not calls:
            # Users may override `on_plain_reply` with a plain function.
            reply: Any = self.on_plain_reply(messages, state)
            answer: Messages | None = await reply if inspect.isawaitable(reply) else reply
            return answer
        return list(await asyncio.gather(*(self.call_tool(c) for c in calls)))
