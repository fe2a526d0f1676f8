"""Checksum manifest of one checkpoint iteration directory (both layouts).

``iter_XXXXXXX/verl_bridge_manifest.json``, written by rank 0 just before the directory is
renamed into place::

    {"version": 1, "algorithm": "sha256",
     "files": {"mp_rank_00/model_optim_rng.pt": {"size": 123, "sha256": "..."}, ...}}

:func:`verify_manifest` re-hashes every listed file and raises
:class:`~verl_bridge.checkpoint.safe_load.CorruptCheckpointError` naming the first file that is
missing, has another size or another digest (a single flipped byte in a ``.distcp`` is caught
here; torch_dist files have no CRC of their own). Megatron-LM ignores the extra file. A directory
without a manifest (written by Megatron-LM, or by verl-bridge before manifests) is not an error:
the structural checks of :func:`verl_bridge.checkpoint.megatron.validate_iteration` still apply.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from verl_bridge.checkpoint.layout import atomic_write_text, is_inside
from verl_bridge.checkpoint.safe_load import CorruptCheckpointError

MANIFEST = "verl_bridge_manifest.json"
_CHUNK = 1 << 22


def file_digest(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(_CHUNK)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def _files(d: Path) -> list[str]:
    out = []
    for dirpath, _, names in os.walk(d):
        for n in names:
            rel = os.path.relpath(os.path.join(dirpath, n), d)
            if rel != MANIFEST and not n.endswith(".partial"):
                out.append(rel)
    return sorted(out)


def write_manifest(d) -> Path:
    """Hash every file under *d* into ``d/verl_bridge_manifest.json`` (atomic)."""
    d = Path(d)
    files = {rel: {"size": (d / rel).stat().st_size, "sha256": file_digest(d / rel)} for rel in _files(d)}
    atomic_write_text(d / MANIFEST, json.dumps({"version": 1, "algorithm": "sha256", "files": files}, indent=1))
    return d / MANIFEST


def verify_manifest(d) -> bool:
    """True when *d* has a manifest and every listed file matches it; False when it has none.

    Raises :class:`CorruptCheckpointError` naming the file that does not match.
    """
    d = Path(d)
    path = d / MANIFEST
    if not path.is_file():
        return False
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        files = manifest["files"]
        if manifest.get("algorithm") != "sha256" or not isinstance(files, dict):
            raise ValueError("unknown layout")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise CorruptCheckpointError(f"checkpoint file {path} (checksum manifest) is corrupted: {exc}") from None
    for rel, want in files.items():
        if not is_inside(rel) or not isinstance(want, dict):
            raise CorruptCheckpointError(
                f"checkpoint file {path} (checksum manifest) is corrupted: entry {rel!r} "
                + ("is not a path inside the iteration directory" if not is_inside(rel) else
                   f"is a {type(want).__name__}, not {{\"size\": ..., \"sha256\": ...}}"))
        f = d / rel
        if not f.is_file():
            raise CorruptCheckpointError(f"checkpoint file {f} is missing (listed in {MANIFEST})")
        size = f.stat().st_size
        if size != want.get("size"):
            raise CorruptCheckpointError(
                f"checkpoint file {f} is {size} bytes, {MANIFEST} says {want.get('size')} (truncated or overwritten)")
        if file_digest(f) != want.get("sha256"):
            raise CorruptCheckpointError(
                f"checkpoint file {f} does not match its sha256 checksum in {MANIFEST} (corrupted on disk)")
    return True
