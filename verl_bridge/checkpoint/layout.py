"""Megatron-LM checkpoint directory layout and atomic file helpers.

::

    <save_dir>/latest_checkpointed_iteration.txt     "100" (or "release"), written last
    <save_dir>/iter_0000100/                          legacy:
        mp_rank_00/model_optim_rng.pt                   PP == 1 (TP rank 00)
        mp_rank_00_000/model_optim_rng.pt               PP > 1  (TP rank 00, PP rank 000)
    <save_dir>/iter_0000100/                          torch_dist (megatron.core.dist_checkpointing):
        metadata.json  common.pt  .metadata  __<rank>_<n>.distcp
    <save_dir>/iter_0000100.tmp-<token>/              a save in progress (never read)

Names follow Megatron-LM's ``get_checkpoint_name`` / ``get_checkpoint_tracker_filename``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Union

TRACKER = "latest_checkpointed_iteration.txt"
LEGACY_FILE = "model_optim_rng.pt"
TMP_MARK = ".tmp-"


def iter_dir(save_dir, iteration: Union[int, str]) -> Path:
    name = "release" if iteration == "release" else f"iter_{int(iteration):07d}"
    return Path(save_dir) / name


def rank_dir_name(tp_rank: int, pp_rank: int, pp_size: int, ep_rank: int = 0, ep_size: int = 1) -> str:
    """Megatron-LM's ``get_checkpoint_name``: ``mp_rank_TT``, ``_PPP`` with pipeline parallelism,
    ``_EEE`` with expert parallelism (each EP rank holds different experts)."""
    name = f"mp_rank_{tp_rank:02d}" if pp_size == 1 else f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"
    return name if ep_size == 1 else f"{name}_{ep_rank:03d}"


def fsync_dir(path) -> None:
    try:
        fd = os.open(str(path), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def open_exclusive(path, mode: str = "w", **kwargs):
    """Open a NEW file at *path* for writing, never through a symlink (a stale file there is removed).

    ``O_EXCL | O_NOFOLLOW``: a symlink planted at *path* is unlinked, not followed, so the write
    cannot land outside the directory.
    """
    path = Path(path)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, 0o644)
    return os.fdopen(fd, mode, **kwargs)


def is_inside(rel) -> bool:
    """*rel* is a non-empty relative path that stays inside its directory (no ``..`` part, not absolute,
    no NUL): what a manifest or a safetensors index written by us or transformers names."""
    return isinstance(rel, str) and bool(rel) and "\0" not in rel and not os.path.isabs(rel) \
        and ".." not in rel.replace("\\", "/").split("/")


def atomic_write_text(path, text: str) -> None:
    """Write *path* via a fresh temporary file and ``os.replace``: readers see the old or the new
    content, never a part; a symlink at *path* is replaced by the file, its target left untouched."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}")
    try:
        with open_exclusive(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(path.parent)


def fsync_tree(root) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            try:
                with open(os.path.join(dirpath, name), "rb") as f:
                    os.fsync(f.fileno())
            except OSError:
                pass
        fsync_dir(dirpath)


def list_iterations(save_dir) -> list[int]:
    """Completed (renamed) ``iter_*`` directories, newest first."""
    out = []
    root = Path(save_dir)
    if not root.is_dir():
        return out
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith("iter_") and TMP_MARK not in p.name:
            try:
                out.append(int(p.name[len("iter_"):]))
            except ValueError:
                continue
    return sorted(out, reverse=True)
