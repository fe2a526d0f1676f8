"""Atomic file writes: a reader sees the old file or the new one, never a partial one."""

from __future__ import annotations

import os
import tempfile


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str, data: bytes) -> None:
    """Write *data* to *path* through a temporary file in the same folder and ``os.replace``.

    A symlink is written through (its target is replaced, the link stays). The mode of an existing
    file is kept; a new file gets ``0o666 & ~umask`` like ``open(path, "w")`` would give it.
    """
    path = os.path.realpath(path)
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    if os.path.exists(path):
        mode = os.stat(path).st_mode & 0o7777
    else:
        mode = 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(prefix=".verl-bridge-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
