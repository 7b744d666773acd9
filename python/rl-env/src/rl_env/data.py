"""Task datasets: lists of dicts, or rows read from JSONL or parquet files, with errors naming the file and line."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

Row = dict[str, Any]
"""One dataset row (a task)."""


class DatasetError(ValueError):
    """A dataset that cannot be used; the message names the file, line and field at fault."""


def load_jsonl(path: str) -> list[Row]:
    """Rows of a JSONL file: one JSON object per non-blank line."""
    rows: list[Row] = []
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        raise DatasetError(f"{path}: cannot open: {e.strerror}") from None
    with f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{path}:{number}: not valid JSON: {e.msg} (column {e.colno})") from None
            if not isinstance(row, dict):
                raise DatasetError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
            rows.append(row)
    return rows


def load_parquet(path: str) -> list[Row]:
    """Rows of a parquet file (needs pyarrow: `pip install rl-env[parquet]`)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from None
    try:
        rows: list[Row] = pq.read_table(path).to_pylist()
        return rows
    except (OSError, ValueError) as e:
        raise DatasetError(f"{path}: cannot read parquet: {e}") from None


def load_dataset(source: str | os.PathLike[str] | Iterable[Any] | None) -> list[Row]:
    """A list of row dicts from a list/tuple of dicts, or a `.jsonl` / `.parquet` path."""
    if source is None:
        return []
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if path.endswith(".jsonl") or path.endswith(".json"):
            return load_jsonl(path)
        if path.endswith(".parquet"):
            return load_parquet(path)
        raise DatasetError(f"{path}: unknown dataset format; expected a .jsonl or .parquet file")
    try:
        rows = list(source)
    except TypeError:
        raise DatasetError(f"a dataset must be a list of dicts or a file path, got {type(source).__name__}") from None
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DatasetError(f"dataset row {i}: expected a dict, got {type(row).__name__}")
    return rows


def split_rows(rows: list[Row], eval_fraction: float, seed: int = 0) -> tuple[list[Row], list[Row]]:
    """Splits rows into (train, eval) with a seeded shuffle; `eval_fraction` in [0, 1)."""
    if not 0.0 <= eval_fraction < 1.0:
        raise DatasetError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
    import random

    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    n_eval = round(len(rows) * eval_fraction)
    eval_idx = set(order[:n_eval])
    train = [r for i, r in enumerate(rows) if i not in eval_idx]
    evals = [r for i, r in enumerate(rows) if i in eval_idx]
    return train, evals
