"""Reading megatron-core ``torch_dist`` checkpoints without unpickling anything outside an allowlist.

A torch_dist iteration directory holds three kinds of pickled data, and stock torch / megatron-core
read two of them with full unpickling (a crafted file runs code on ``resume`` and ``convert``):

``.metadata``
    ``torch.distributed.checkpoint.FileSystemReader.read_metadata`` does ``pickle.load``.
    Here: :class:`RestrictedUnpickler`, which resolves only the classes of
    ``torch.distributed.checkpoint.metadata`` (Metadata, TensorStorageMetadata, ...), the
    filesystem's ``_StorageInfo``, ``torch.Size`` / dtypes / layouts / memory formats, ``pathlib``
    paths and a few builtin containers -- what a real ``.metadata`` holds.
byte items of ``__<rank>_<n>.distcp`` (our ``optimizer`` and ``rng_state`` ShardedObjects)
    torch's ``DefaultLoadPlanner.load_bytes`` does ``torch.load(weights_only=False)``.
    Here: :class:`SafeLoadPlanner` loads them with ``weights_only=True`` and the Megatron allowlist
    of :mod:`verl_bridge.checkpoint.safe_load`.
``common.pt``
    megatron-core's ``TorchCommonLoadStrategy`` uses ``torch.load``'s default (weights_only only on
    torch >= 2.6). Here: :func:`load_common` / :class:`SafeCommonLoadStrategy`, always
    :func:`~verl_bridge.checkpoint.safe_load.safe_load`.

Tensor data in ``.distcp`` is already read with ``weights_only=True`` by torch.

megatron-core shim (0.13.1, 0.16.1 and, from reading its source, 0.19.2 alike): ``TorchDistLoadShardedStrategy.load`` builds its
reader with the module function ``_get_filesystem_reader(dir, cache_metadata=True)`` and its planner
as ``MCoreLoadPlanner(...)`` inside the method (0.13.1 also reads the metadata first through
``get_reformulation_metadata`` -> ``_get_filesystem_reader``), with no parameter to pass others.
:func:`mcore_safe_reading` points those two names of
``megatron.core.dist_checkpointing.strategies.torch`` at the safe versions for the duration of one
load and restores them after; where a megatron-core version lacks them the shim refuses to load
rather than fall back to unrestricted unpickling. megatron-core 0.19 dropped ``load``'s
``common_strategy`` parameter (it reads ``common.pt`` itself with torch's default, weights_only
on torch >= 2.6): :func:`load_kwargs` passes it only where it exists, and the caller reads
``common.pt`` through :func:`load_common` first in every version.

A refusal raises :class:`~verl_bridge.checkpoint.safe_load.CheckpointError` naming the type and the
file, in the same words as the legacy path. ``trust=True`` (the explicit opt-in for trusted files)
skips all of this with a warning.
"""

from __future__ import annotations

import io
import os
import pickle
import struct
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch

from verl_bridge.checkpoint.safe_load import (
    CheckpointError,
    CorruptCheckpointError,
    is_refusal,
    refusal_message,
    safe_globals,
    safe_load,
)

METADATA_FILE = ".metadata"
COMMON_FILE = "common.pt"

_DCP_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_ALLOWED_NAMES = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # torch.layout by name (a dict lookup)
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"), ("pathlib", "Path"),
    ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "tuple"), ("builtins", "list"),
    ("builtins", "dict"), ("builtins", "slice"), ("builtins", "complex"),
    ("collections", "OrderedDict"), ("collections", "defaultdict"),
    ("copyreg", "_reconstructor"),  # calls base.__new__(cls): both resolved through this allowlist
}
_TORCH_VALUE_TYPES = (torch.dtype, torch.layout, torch.memory_format)


class RestrictedUnpickler(pickle._Unpickler):
    """Unpickler resolving only what a torch.distributed.checkpoint ``.metadata`` holds.

    The pure-Python unpickler, so that BUILD can be checked too: pickle's BUILD sets attributes on
    whatever object is on the stack, and on an allowlisted *class* or *function* (``pathlib.PosixPath``,
    ``Metadata``, ``torch.serialization._get_layout``) that would rewrite it for the whole process
    (e.g. ``PosixPath.__truediv__``) even though the load is refused afterwards. BUILD is allowed
    only on instances of the classes this unpickler resolved.
    """

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._resolved: set = set()

    def find_class(self, module: str, name: str):
        if module == _DCP_METADATA_MODULE:
            import torch.distributed.checkpoint.metadata as md

            obj = getattr(md, name, None)
            if isinstance(obj, type) and obj.__module__ == _DCP_METADATA_MODULE:
                self._resolved.add(obj)
                return obj
        elif (module, name) in _ALLOWED_NAMES:
            obj = super().find_class(module, name)
            self._resolved.add(obj)
            return obj
        elif module == "torch" and isinstance(getattr(torch, name, None), _TORCH_VALUE_TYPES):
            return getattr(torch, name)  # torch.float32, torch.strided, torch.contiguous_format, ...
        raise pickle.UnpicklingError(f"GLOBAL {module}.{name} is not allowed")

    def load_build(self):
        inst = self.stack[-2]  # below the state
        if isinstance(inst, type) or type(inst) not in self._resolved:
            what = inst if isinstance(inst, type) else type(inst)
            raise pickle.UnpicklingError(
                f"GLOBAL {getattr(what, '__module__', '?')}.{getattr(what, '__qualname__', '?')} "
                "(a BUILD that sets attributes on it) is not allowed")
        super().load_build()

    dispatch[pickle.BUILD[0]] = load_build


def read_metadata(path, *, trust: bool = False):
    """The ``Metadata`` object of a ``.metadata`` file, unpickled through the allowlist."""
    path = Path(path)
    if not path.is_file():
        raise CorruptCheckpointError(f"checkpoint file {path} is missing")
    with open(path, "rb") as f:
        if trust:
            warnings.warn(f"loading {path} with full unpickling: arbitrary objects are unpickled", stacklevel=2)
            return pickle.load(f)
        try:
            md = RestrictedUnpickler(f).load()
        except pickle.UnpicklingError as exc:
            if "is not allowed" in str(exc):
                raise CheckpointError(refusal_message(path, str(exc))) from None
            raise CorruptCheckpointError(f"checkpoint file {path} is truncated or corrupted: {exc}") from None
        except (EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError, UnicodeDecodeError,
                MemoryError, OverflowError, struct.error, RecursionError) as exc:  # the pure-Python unpickler's errors
            raise CorruptCheckpointError(
                f"checkpoint file {path} is truncated or corrupted: {type(exc).__name__}: {exc}") from None
    from torch.distributed.checkpoint.metadata import Metadata

    if not isinstance(md, Metadata):
        raise CorruptCheckpointError(f"checkpoint file {path} does not hold torch.distributed.checkpoint "
                                     f"Metadata (found {type(md).__name__})")
    check_storage_paths(md, path)
    return md


def check_storage_paths(md, path) -> None:
    """Refuse a ``.metadata`` whose data files are not plain names inside the iteration directory.

    torch's FileSystemReader opens ``<dir>/<relative_path>`` as written, so ``../../x`` or an absolute
    path would read tensors from a file outside the checkpoint. torch / megatron-core write flat names
    (``__0_0.distcp``).
    """
    storage = getattr(md, "storage_data", None)
    if storage is None:
        return
    if not isinstance(storage, dict):
        raise CorruptCheckpointError(f"checkpoint file {path} is corrupted: storage_data is a "
                                     f"{type(storage).__name__}, not a dict")
    for info in storage.values():
        rel = getattr(info, "relative_path", None)
        if not isinstance(rel, str) or not rel or rel in (".", "..") or "/" in rel or "\\" in rel \
                or "\0" in rel or os.path.isabs(rel):
            raise CheckpointError(
                f"checkpoint file {path} names the data file {rel!r}, which is not a plain file name inside "
                f"{path.parent}; torch_dist data files are plain names such as '__0_0.distcp'. Refused: it "
                "would read data from outside the checkpoint.")


def load_bytes_item(value: io.BytesIO, where: str):
    """``torch.load(weights_only=True)`` of one byte item; *where* names file and item in errors."""
    try:
        with torch.serialization.safe_globals(list(safe_globals())):
            return torch.load(value, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        msg = str(exc)
        if is_refusal(msg):
            raise CheckpointError(refusal_message(where, msg)) from None
        raise CorruptCheckpointError(f"checkpoint file {where} is truncated or corrupted: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - any decoding failure of a damaged item
        raise CorruptCheckpointError(
            f"checkpoint file {where} is truncated or corrupted: {type(exc).__name__}: {exc}") from None


def load_common(checkpoint_dir, *, trust: bool = False) -> dict:
    """``common.pt`` of a torch_dist directory, through :func:`safe_load`."""
    return safe_load(Path(checkpoint_dir) / COMMON_FILE, trust=trust)


def _reader_class():
    from torch.distributed.checkpoint import FileSystemReader

    class SafeFileSystemReader(FileSystemReader):
        """FileSystemReader whose ``read_metadata`` goes through :func:`read_metadata` (cached)."""

        _safe_metadata = None

        def read_metadata(self, *args, **kwargs):
            if self._safe_metadata is None:
                md = read_metadata(Path(self.path) / METADATA_FILE)
                try:
                    from torch.distributed.checkpoint.metadata import StorageMeta

                    if getattr(md, "storage_meta", None) is None:
                        md.storage_meta = StorageMeta()
                    md.storage_meta.load_id = self.load_id
                except ImportError:  # pragma: no cover - torch < 2.4 has no StorageMeta
                    pass
                self._safe_metadata = md
            return self._safe_metadata

    return SafeFileSystemReader


def _planner_class(base):
    from torch.distributed.checkpoint._traverse import set_element

    class SafeLoadPlanner(base):
        """The planner megatron-core asked for, with byte items read ``weights_only=True``."""

        def load_bytes(self, read_item, value):
            where = f"byte item {read_item.dest_index.fqn!r}"
            info = (getattr(self.metadata, "storage_data", None) or {}).get(read_item.storage_index)
            if info is not None and self.checkpoint_dir is not None:
                where = f"{Path(self.checkpoint_dir) / info.relative_path} ({where})"
            obj = load_bytes_item(value, where)
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
            else:
                self.state_dict[read_item.dest_index.fqn] = obj

    SafeLoadPlanner.checkpoint_dir = None
    return SafeLoadPlanner


@contextmanager
def mcore_safe_reading(checkpoint_dir):
    """Make megatron-core's ``TorchDistLoadShardedStrategy`` read through the safe reader and planner.

    See the module docstring (megatron-core 0.13.1 / 0.16.1 shim). Restores the module on exit.
    """
    from megatron.core.dist_checkpointing.strategies import torch as mcore_torch

    orig_reader = getattr(mcore_torch, "_get_filesystem_reader", None)
    orig_planner = getattr(mcore_torch, "MCoreLoadPlanner", None)
    if orig_reader is None or orig_planner is None:
        import megatron.core

        raise CheckpointError(
            f"megatron-core {getattr(megatron.core, '__version__', '?')} builds its torch_dist reader differently "
            "from 0.13-0.16 (no _get_filesystem_reader / MCoreLoadPlanner in "
            "megatron.core.dist_checkpointing.strategies.torch), so verl-bridge cannot read "
            f"{checkpoint_dir} with its restricted unpickler. If you trust this checkpoint, load it with trust=True.")
    reader_cls = _reader_class()
    planner_cls = _planner_class(orig_planner)
    planner_cls.checkpoint_dir = str(checkpoint_dir)

    def safe_reader(path, cache_metadata: bool = False, **_):  # 0.19 adds async_strategy=
        return reader_cls(path)

    mcore_torch._get_filesystem_reader = safe_reader
    mcore_torch.MCoreLoadPlanner = planner_cls
    try:
        yield
    finally:
        mcore_torch._get_filesystem_reader = orig_reader
        mcore_torch.MCoreLoadPlanner = orig_planner


def load_kwargs(trust: bool = False) -> dict:
    """Extra keyword arguments for ``dist_checkpointing.load`` (the safe common strategy where accepted)."""
    import inspect

    from megatron.core import dist_checkpointing

    if "common_strategy" in inspect.signature(dist_checkpointing.load).parameters:
        return {"common_strategy": common_strategy(trust=trust)}
    return {}


def common_strategy(trust: bool = False):
    """megatron-core common-state load strategy reading ``common.pt`` through :func:`safe_load`."""
    from megatron.core.dist_checkpointing.strategies.common import TorchCommonLoadStrategy

    class SafeCommonLoadStrategy(TorchCommonLoadStrategy):
        def load_common(self, checkpoint_dir):
            return load_common(checkpoint_dir, trust=trust)

        def load_sharded_objects(self, sharded_objects_state_dict, checkpoint_dir):
            raise CheckpointError(f"{checkpoint_dir}: ShardedObjects stored as separate .pt files are not read by "
                                  "verl-bridge's safe loader (torch_dist keeps them in the .distcp files)")

    return SafeCommonLoadStrategy()


def unwrap_dcp_failure(exc: BaseException) -> BaseException:
    """The first per-rank exception inside torch's ``CheckpointException`` (else *exc* itself).

    torch gathers every rank's failure of a dcp load into one ``CheckpointException`` (a
    BaseException, not an Exception); our own CheckpointError inside it is what the user needs.
    """
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict):
        for pair in failures.values():
            inner = pair[0] if isinstance(pair, tuple) and pair else pair
            if isinstance(inner, CheckpointError):
                return inner
        for pair in failures.values():
            inner = pair[0] if isinstance(pair, tuple) and pair else pair
            if isinstance(inner, BaseException):
                return inner
    return exc


def is_dcp_failure(exc: BaseException) -> bool:
    from torch.distributed.checkpoint.api import CheckpointException

    return isinstance(exc, CheckpointException)

