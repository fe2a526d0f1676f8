"""Hostile checkpoint files: pickles whose loading would run ``touch MARKER`` (os.system).

Each ``poison_*`` rewrites one file of a torch_dist iteration directory the way an attacker with
write access would, keeping everything else (and the rest of the file) loadable, and then
re-signs the checksum manifest, so that only the safe unpickling stands between the file and the
shell command.
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path

import torch


class Touch:
    """Unpickling this object runs ``touch <marker>``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _resign(d: Path) -> None:
    try:
        from verl_bridge.checkpoint.manifest import write_manifest
    except ImportError:  # before checksum manifests existed
        return
    write_manifest(d)


def poison_metadata(d, marker) -> Path:
    path = Path(d) / ".metadata"
    path.write_bytes(pickle.dumps(Touch(marker)))
    _resign(Path(d))
    return path


def poison_common(d, marker) -> Path:
    from verl_bridge.checkpoint.safe_load import safe_load

    path = Path(d) / "common.pt"
    common = safe_load(path)
    common["evil"] = Touch(marker)
    torch.save(common, path)
    _resign(Path(d))
    return path


def poison_distcp(d, marker, prefix: str = "optimizer") -> Path:
    """Point the byte item ``<prefix>/...`` of the .metadata at a payload appended to its .distcp."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    d = Path(d)
    md = pickle.loads((d / ".metadata").read_bytes())  # our own trusted file: plain pickle is fine here
    idx = next(i for i in md.storage_data if i.fqn.startswith(prefix + "/"))
    info = md.storage_data[idx]
    buf = io.BytesIO()
    torch.save({"state": Touch(marker)}, buf)
    target = d / info.relative_path
    offset = target.stat().st_size
    with open(target, "ab") as f:
        f.write(buf.getvalue())
    md.storage_data[idx] = _StorageInfo(relative_path=info.relative_path, offset=offset, length=len(buf.getvalue()),
                                        transform_descriptors=getattr(info, "transform_descriptors", None))
    (d / ".metadata").write_bytes(pickle.dumps(md))
    _resign(d)
    return target


POISONS = {".metadata": poison_metadata, "common.pt": poison_common, ".distcp": poison_distcp}
