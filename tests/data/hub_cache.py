"""A Hugging Face hub cache built offline, laid out the way ``huggingface_hub`` writes it::

    <cache>/models--ORG--NAME/blobs/<sha256 of the file>
    <cache>/models--ORG--NAME/snapshots/<commit>/<file> -> ../../blobs/<sha256>
    <cache>/models--ORG--NAME/refs/<branch or tag>   (the commit, no newline)

filled from a tiny model saved locally (tests/arch/tiny_hf.py), so ids resolve with HF_HUB_OFFLINE=1.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def add_to_cache(cache: Path, repo_id: str, model_dir: Path, ref: str = "main", commit: str | None = None) -> Path:
    """Put every file of *model_dir* into *cache* as *repo_id* at *ref*; return the snapshot directory."""
    repo = Path(cache) / ("models--" + repo_id.replace("/", "--"))
    commit = commit or hashlib.sha1(f"{repo_id}@{ref}".encode()).hexdigest()
    snap = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    for src in sorted(Path(model_dir).rglob("*")):
        if not src.is_file():
            continue
        data = src.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        dst = snap / src.relative_to(model_dir)
        dst.parent.mkdir(parents=True, exist_ok=True)
        if dst.exists() or dst.is_symlink():
            dst.unlink()
        os.symlink(os.path.relpath(blob, dst.parent), dst)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    return snap
