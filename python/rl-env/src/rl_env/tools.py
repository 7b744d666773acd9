"""Tools as plain Python functions: the JSON schema the model sees comes from the signature and docstring."""

from __future__ import annotations

import inspect
import typing
from typing import Any, Callable

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


def _json_type(annotation: Any) -> dict[str, Any]:
    if annotation is inspect.Parameter.empty:
        return {}
    origin = typing.get_origin(annotation)
    if origin is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _json_type(args[0]) if len(args) == 1 else {}
    if origin is typing.Literal:
        values = list(typing.get_args(annotation))
        return {"enum": values}
    if origin in (list, tuple):
        item_args = typing.get_args(annotation)
        schema: dict[str, Any] = {"type": "array"}
        if item_args and origin is list:
            schema["items"] = _json_type(item_args[0])
        return schema
    if origin is dict:
        return {"type": "object"}
    if annotation in _JSON_TYPES:
        return {"type": _JSON_TYPES[annotation]}
    return {}


def _parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """(description, {param: description}) from a Google- or reST-style docstring."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    description: list[str] = []
    params: dict[str, str] = {}
    in_args = False
    current: str | None = None
    for line in lines:
        stripped = line.strip()
        if stripped.lower() in ("args:", "arguments:", "parameters:"):
            in_args = True
            continue
        if stripped.lower() in ("returns:", "raises:", "yields:", "examples:"):
            in_args = False
            current = None
            continue
        if stripped.startswith(":param "):
            name, _, text = stripped[len(":param ") :].partition(":")
            params[name.strip().split()[-1]] = text.strip()
            continue
        if in_args:
            head, sep, text = stripped.partition(":")
            if sep and head and " " not in head.split("(")[0].strip():
                current = head.split("(")[0].strip()
                params[current] = text.strip()
            elif current and stripped:
                params[current] += " " + stripped
            continue
        if not params and not in_args:
            description.append(stripped)
    text = " ".join(part for part in " ".join(description).split("  ") if part).strip()
    return text, params


def tool_schema(func: Callable[..., Any]) -> dict[str, Any]:
    """`{"name", "description", "parameters"}` for `func` (OpenAI function-tool shape)."""
    name = getattr(func, "__name__", None)
    if not name or not name.isidentifier():
        raise ValueError(f"a tool needs a function name, got {func!r}")
    description, param_docs = _parse_docstring(inspect.getdoc(func))
    try:
        hints = typing.get_type_hints(func)
    except Exception:  # unresolvable annotations: fall back to the raw ones
        hints = {}
    properties: dict[str, Any] = {}
    required: list[str] = []
    for p in inspect.signature(func).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        schema = dict(_json_type(hints.get(p.name, p.annotation)))
        if p.name in param_docs:
            schema["description"] = param_docs[p.name]
        if p.default is inspect.Parameter.empty:
            required.append(p.name)
        properties[p.name] = schema
    parameters = {"type": "object", "properties": properties, "required": required}
    return {"name": name, "description": description, "parameters": parameters}
