"""Prompt files: JSONL or Parquet rows with ``data.prompt_key`` and ``data.answer_key`` (verl's layout).

Bad rows raise :class:`PromptFileError` naming the file and line (row for Parquet). A row's other
fields travel with its answer as :attr:`GroundTruth.extra`, for reward functions that take them.
"""

from __future__ import annotations

import json
import os


class PromptFileError(ValueError):
    pass


class GroundTruth(str):
    """The answer string of a row; ``extra`` holds the row's other fields (not prompt or answer)."""

    extra: dict

    def __new__(cls, value: str, extra: dict | None = None):
        obj = super().__new__(cls, value)
        obj.extra = dict(extra or {})
        return obj

    def __reduce__(self):
        return (GroundTruth, (str(self), self.extra))


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
    extra = {k: v for k, v in obj.items() if k not in (pk, ak)}
    return str(obj[pk]), GroundTruth("" if obj.get(ak) is None else str(obj[ak]), extra)


def _rows_parquet(path: str, pk: str, ak: str) -> list[tuple[str, str]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise PromptFileError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
    table = pq.read_table(path).to_pylist()
    return [_row(obj, path, f"row {i}", pk, ak) for i, obj in enumerate(table)]


def load_prompt_file(config, files: str | None = None, key: str = "data.train_files") -> list[tuple[str, str]]:
    """All (prompt, answer) rows of ``data.train_files`` (or ``files``; comma-separated, relative to the config)."""
    d = config.data
    files = d.train_files if files is None else files
    rows: list[tuple[str, str]] = []
    for name in str(files).split(","):
        path = name if os.path.isabs(name) else os.path.join(config.source_dir or os.getcwd(), name)
        if not os.path.exists(path):
            path = name
        loader = _rows_parquet if path.endswith(".parquet") else _rows_jsonl
        rows += loader(path, d.prompt_key, d.answer_key)
    if not rows:
        raise PromptFileError(f"{key}={files!r}: no rows")
    return rows


def local_dir(path, source_dir, revision=None):
    """A relative HF directory is looked up next to the config first (as validation does), then in cwd;
    a hub id (``ORG/NAME``) resolves to its snapshot in the Hugging Face cache (:mod:`verl_bridge.data.hub`)."""
    from verl_bridge.data.hub import resolve

    return resolve(path, source_dir, revision)
