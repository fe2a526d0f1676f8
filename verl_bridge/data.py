"""Prompt files: JSONL or Parquet rows with ``data.prompt_key`` and ``data.answer_key`` (verl's layout).

Bad rows raise :class:`PromptFileError` naming the file and line (row for Parquet).
"""

from __future__ import annotations

import json
import os


class PromptFileError(ValueError):
    pass


def _rows_jsonl(path: str, pk: str, ak: str) -> list[tuple[str, str]]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise PromptFileError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
            rows.append(_row(obj, path, f"line {lineno}", pk, ak))
    return rows


def _row(obj, path, where, pk, ak) -> tuple[str, str]:
    if not isinstance(obj, dict):
        raise PromptFileError(f"{path}: {where}: expected a JSON object, got {type(obj).__name__}")
    if pk not in obj:
        raise PromptFileError(f"{path}: {where}: missing '{pk}' (data.prompt_key); keys: {', '.join(map(str, obj))}")
    return str(obj[pk]), "" if obj.get(ak) is None else str(obj[ak])


def _rows_parquet(path: str, pk: str, ak: str) -> list[tuple[str, str]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise PromptFileError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
    table = pq.read_table(path).to_pylist()
    return [_row(obj, path, f"row {i}", pk, ak) for i, obj in enumerate(table)]


def load_prompt_file(config) -> list[tuple[str, str]]:
    """All (prompt, answer) rows of ``data.train_files`` (comma-separated, relative to the config)."""
    d = config.data
    rows: list[tuple[str, str]] = []
    for name in str(d.train_files).split(","):
        path = name if os.path.isabs(name) else os.path.join(config.source_dir or os.getcwd(), name)
        if not os.path.exists(path):
            path = name
        loader = _rows_parquet if path.endswith(".parquet") else _rows_jsonl
        rows += loader(path, d.prompt_key, d.answer_key)
    if not rows:
        raise PromptFileError(f"data.train_files={d.train_files!r}: no rows")
    return rows
