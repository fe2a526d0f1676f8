"""Per-rank, collective save / load of ONE model's Megatron-LM checkpoint directory.

The trainer keeps the actor and the critic in ``<output_dir>/checkpoints/actor`` and
``.../critic``, each a plain Megatron-LM save dir (layout: :mod:`verl_bridge.checkpoint.layout`).

``state`` (what :func:`save` takes and :func:`load` returns)::

    model               nn.Module (GPTModel) or its state dict (legacy) / sharded state dict
                        (torch_dist). load() returns the plain state dict (and loads it into
                        ``model=`` when given).
    optimizer           optimizer.state_dict() (per rank)
    opt_param_scheduler scheduler state dict
    rng_state           list with one dict per rank, Megatron-LM style: random_rng_state,
                        np_rng_state, torch_rng_state[, cuda_rng_state, rng_tracker_states]
                        (see :func:`capture_rng_state` / :func:`restore_rng_state`)
    args                argparse.Namespace (tensor_model_parallel_size, ... as Megatron-LM's)
    iteration, checkpoint_version (3.0 as Megatron-LM)
    ...                 any extra trainer state (data position, adaptive-KL state, ...)

Legacy: ranks with DP rank 0 each write ``mp_rank_XX[_YYY][_EEE]/model_optim_rng.pt`` with these
keys. torch_dist: the model (and nothing else) as ShardedTensors; ``optimizer`` and
``rng_state`` as per-(PP, TP)-rank ShardedObjects (replica = DP rank; Megatron-LM stores its
``rng_state`` the same way); everything else in ``common.pt``. Expert parallelism (MoE): the legacy
writers are expert-data-parallel rank 0 of each (TP, PP, EP) rank, in ``mp_rank_TT[_PPP]_EEE``
(Megatron-LM's name); torch_dist objects are sharded (PP, TP, EP) over the expert-data-parallel
replicas, and megatron's own MoE ``sharded_state_dict`` places each expert by its global index,
so a checkpoint saved at EP=2 loads at EP=1 (or any EP dividing the experts). Written with
:class:`~verl_bridge.checkpoint.torch_dist.SyncTorchDistSaveStrategy` (CPU-safe).

Crash safety: every rank writes under ``iter_XXXXXXX.tmp-save`` (:func:`write`, which first
checks the free space and on a full disk removes the partial save and says "no space left on
device"); after a barrier rank 0 writes the checksum manifest
(:mod:`~verl_bridge.checkpoint.manifest`), fsyncs, renames it to ``iter_XXXXXXX``, then rewrites
``latest_checkpointed_iteration.txt`` (atomic replace), then prunes to ``keep_last``
(:func:`publish`). A run killed at any point leaves the previous complete checkpoint visible.
:func:`latest_valid_iteration` skips unfinished and corrupted iterations (sha256 of every file
against the manifest; CRCs of the legacy layout / torch_dist's common.pt; torch_dist's
``.metadata``), so ``resume: auto`` falls back to the previous good one.

Without torch.distributed initialised everything runs as a world of one.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import zipfile
from pathlib import Path
from typing import Any, Optional

import torch

from verl_bridge.checkpoint.layout import (
    LEGACY_FILE,
    TMP_MARK,
    TRACKER,
    atomic_write_text,
    fsync_dir,
    fsync_tree,
    iter_dir,
    list_iterations,
    rank_dir_name,
)
from verl_bridge.checkpoint.safe_load import CheckpointError, CorruptCheckpointError, safe_globals, safe_load
from verl_bridge.checkpoint.torch_dist import SyncTorchDistSaveStrategy, is_torch_dist_dir

log = logging.getLogger(__name__)
CHECKPOINT_VERSION = 3.0
SHARDED_OBJECT_KEYS = ("optimizer", "rng_state")
FORMATS = ("legacy", "torch_dist")


# ---- rank bookkeeping ---------------------------------------------------------------------

def is_dist() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def barrier() -> None:
    if is_dist():
        torch.distributed.barrier()


_dist, _barrier = is_dist, barrier


def _ranks(args=None) -> dict:
    """tp/pp/dp rank and size of this process (megatron parallel state, else args, else 1)."""
    from verl_bridge.distributed.state import model_parallel_state

    ps = model_parallel_state()
    if ps is not None:
        return dict(tp_rank=ps.tp_rank, tp_size=ps.tp_size, pp_rank=ps.pp_rank, pp_size=ps.pp_size,
                    dp_rank=ps.dp_rank, rank=ps.rank, ep_rank=ps.ep_rank, ep_size=ps.ep_size,
                    writer_rank=ps.edp_rank if ps.ep_size > 1 else ps.dp_rank)
    return dict(tp_rank=0, tp_size=getattr(args, "tensor_model_parallel_size", 1) or 1, pp_rank=0,
                pp_size=getattr(args, "pipeline_model_parallel_size", 1) or 1, dp_rank=0,
                rank=torch.distributed.get_rank() if _dist() else 0, ep_rank=0, ep_size=1, writer_rank=0)


def _object_sharding(ranks: dict) -> tuple[tuple, tuple, int]:
    """``(global shape, offset, replica id)`` of this rank's per-rank objects (optimizer, RNG):
    (PP, TP) replicated over DP; with expert parallelism (PP, TP, EP) replicated over the
    expert-data-parallel group, since each EP rank's optimizer holds its own experts' state."""
    if ranks.get("ep_size", 1) > 1:
        return ((ranks["pp_size"], ranks["tp_size"], ranks["ep_size"]),
                (ranks["pp_rank"], ranks["tp_rank"], ranks["ep_rank"]), ranks["writer_rank"])
    return (ranks["pp_size"], ranks["tp_size"]), (ranks["pp_rank"], ranks["tp_rank"]), ranks["dp_rank"]


# ---- RNG state ----------------------------------------------------------------------------

def capture_rng_state() -> list[dict]:
    """This rank's RNG state in Megatron-LM's ``rng_state`` shape (a one-element list)."""
    import numpy as np

    state = {
        "random_rng_state": random.getstate(),
        "np_rng_state": np.random.get_state(),
        "torch_rng_state": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda_rng_state"] = torch.cuda.get_rng_state()
        from megatron.core import tensor_parallel

        state["rng_tracker_states"] = tensor_parallel.get_cuda_rng_tracker().get_states()
    return [state]


def restore_rng_state(rng_state) -> None:
    import numpy as np

    state = rng_state[0] if isinstance(rng_state, (list, tuple)) else rng_state
    random.setstate(state["random_rng_state"])
    np.random.set_state(state["np_rng_state"])
    torch.set_rng_state(state["torch_rng_state"])
    if torch.cuda.is_available() and "cuda_rng_state" in state:
        torch.cuda.set_rng_state(state["cuda_rng_state"])
        if state.get("rng_tracker_states") is not None:
            from megatron.core import tensor_parallel

            tensor_parallel.get_cuda_rng_tracker().set_states(state["rng_tracker_states"])


# ---- save ---------------------------------------------------------------------------------

def _model_state_dict(model) -> dict:
    if isinstance(model, torch.nn.Module):
        fn = getattr(model, "state_dict_for_save_checkpoint", None)
        return fn() if fn is not None else model.state_dict()
    return model


def _write_legacy(tmp: Path, state: dict, ranks: dict) -> None:
    # one writer per (TP, PP[, EP]) rank: DP rank 0, or with expert parallelism expert-data-parallel
    # rank 0 (as Megatron-LM), so that every EP rank's experts are written
    if ranks["writer_rank"] != 0:
        return
    payload = dict(state)
    payload["model"] = _model_state_dict(state["model"])
    payload.setdefault("checkpoint_version", CHECKPOINT_VERSION)
    path = tmp / rank_dir_name(ranks["tp_rank"], ranks["pp_rank"], ranks["pp_size"], ranks["ep_rank"],
                               ranks["ep_size"]) / LEGACY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)


def _sharded_objects(state: dict, ranks: dict) -> dict:
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    out = {}
    shape, offset, replica = _object_sharding(ranks)
    for key in SHARDED_OBJECT_KEYS:
        if state.get(key) is not None:
            out[key] = ShardedObject(key, state[key], shape, offset, replica_id=replica)
    return out


def _write_torch_dist(tmp: Path, state: dict, ranks: dict) -> None:
    from megatron.core import dist_checkpointing

    model = state["model"]
    sharded = {k: v for k, v in state.items() if k not in ("model",) + SHARDED_OBJECT_KEYS}
    sharded["model"] = model.sharded_state_dict() if isinstance(model, torch.nn.Module) else model
    sharded.update(_sharded_objects(state, ranks))
    sharded.setdefault("checkpoint_version", CHECKPOINT_VERSION)
    sharded["verl_bridge_sharded_objects"] = [k for k in SHARDED_OBJECT_KEYS if state.get(k) is not None]
    dist_checkpointing.save(sharded, str(tmp), sharded_strategy=SyncTorchDistSaveStrategy())


def tensor_bytes(obj, seen=None) -> int:
    """Bytes of the tensors reachable from *obj* (dicts, lists, tuples, modules' state dicts)."""
    if seen is None:
        seen = set()
    if isinstance(obj, torch.nn.Module):
        obj = obj.state_dict()
    if torch.is_tensor(obj):
        key = (obj.data_ptr(), obj.numel()) if obj.numel() else id(obj)
        if key in seen:
            return 0
        seen.add(key)
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v, seen) for v in obj)
    return 0


def is_disk_full(exc: BaseException) -> bool:
    """ENOSPC, also as torch.save reports it for a path (``unexpected pos``: a short write)."""
    import errno

    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("unexpected pos" in text or "No space left" in text
                                              or "file write failed" in text)


def disk_full_message(path, needed: int, iteration, free: Optional[int] = None) -> str:
    if free is None:
        try:
            free = shutil.disk_usage(Path(path).parent).free
        except OSError:
            free = None
    have = f"{free} bytes free there" if free is not None else "free space unknown"
    return (f"no space left on device while saving checkpoint iteration {iteration} to {path}: it needs about "
            f"{needed} bytes ({needed / 2**20:.1f} MiB), {have}. The partial save was removed and the previous "
            "checkpoint is intact; free space (or lower trainer.keep_last, or point trainer.output_dir at a "
            "larger disk) and resume with trainer.resume=auto.")


def _all_errors(local: Optional[str]) -> list[str]:
    """Every rank's error message of the write phase (a collective; doubles as the barrier)."""
    if not _dist():
        return [local] if local else []
    gathered: list = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, local)
    return [e for e in gathered if e]


def write(save_dir, iteration: int, state: dict, *, fmt: str = "legacy") -> Path:
    """Collective: every rank writes its part of *state* under ``iter_XXXXXXX.tmp-save``; returns it.

    Nothing becomes visible: :func:`publish` (rank 0) renames it into place. Before writing, each
    rank checks that its part fits on the filesystem; a full disk (before or during the write)
    removes the temporary directory on every rank and raises :class:`CheckpointError` saying
    "no space left on device" with the path and the bytes needed. Any other write error also
    removes it and is raised on every rank.
    """
    if fmt not in FORMATS:
        raise ValueError(f"checkpoint format {fmt!r} is not one of {', '.join(FORMATS)}")
    if "model" not in state:
        raise ValueError("checkpoint state needs a 'model' entry")
    ranks = _ranks(state.get("args"))
    save_dir = Path(save_dir)
    final = iter_dir(save_dir, iteration)
    tmp = final.with_name(final.name + TMP_MARK + "save")
    state = {**state, "iteration": iteration}
    if ranks["rank"] == 0:
        save_dir.mkdir(parents=True, exist_ok=True)
        if tmp.is_symlink() or tmp.is_file():
            tmp.unlink()
        elif tmp.exists():
            shutil.rmtree(tmp)  # leftover of a killed save
        tmp.mkdir()
    _barrier()
    writes = fmt == "torch_dist" or ranks["writer_rank"] == 0
    needed = tensor_bytes({k: v for k, v in state.items() if k in ("model", "optimizer")}) + (1 << 20) if writes else 0
    error = None
    try:
        free = shutil.disk_usage(tmp).free
        if writes and free < needed:
            error = disk_full_message(tmp, needed, iteration, free)
        elif fmt == "legacy":
            _write_legacy(tmp, state, ranks)
        else:
            _write_torch_dist(tmp, state, ranks)
    except Exception as exc:  # noqa: BLE001 - reported on every rank below
        if is_disk_full(exc):
            error = disk_full_message(tmp, needed, iteration)
        else:
            error = f"writing checkpoint iteration {iteration} to {tmp} failed: {type(exc).__name__}: {exc}"
    errors = _all_errors(error)
    if errors:
        if ranks["rank"] == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        _barrier()
        raise CheckpointError(errors[0])
    return tmp


def save(save_dir, iteration: int, state: dict, *, fmt: str = "legacy", keep_last: Optional[int] = None) -> Path:
    """Collective save of *state* as iteration *iteration* under *save_dir*; returns the iter dir.

    Every rank calls it: :func:`write`, then rank 0 :func:`publish` es. See the module docstring
    for the layout and the crash-safety steps.
    """
    tmp = write(save_dir, iteration, state, fmt=fmt)
    final = iter_dir(save_dir, iteration)
    if _ranks(state.get("args"))["rank"] == 0:
        publish(save_dir, tmp, iteration, keep_last)
    _barrier()
    return final


def begin(save_dir, iteration) -> Path:
    """Fresh temporary directory for iteration *iteration* (single-process writers)."""
    final = iter_dir(save_dir, iteration)
    tmp = final.with_name(final.name + TMP_MARK + "save")
    Path(save_dir).mkdir(parents=True, exist_ok=True)
    if tmp.is_symlink() or tmp.is_file():
        tmp.unlink()
    elif tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    return tmp


def publish(save_dir, tmp: Path, iteration, keep_last: Optional[int] = None, *, tracker: bool = True) -> Path:
    """Write the checksum manifest into *tmp*, fsync it, rename it to ``iter_XXXXXXX``, then (with
    *tracker*) write ``latest_checkpointed_iteration.txt``, then prune to *keep_last*.

    The trainer publishes several roles as one step with ``tracker=False`` and writes the trackers
    after its completion marker (:mod:`verl_bridge.checkpoint.trainer_state`).
    """
    from verl_bridge.checkpoint.manifest import write_manifest

    save_dir = Path(save_dir)
    final = iter_dir(save_dir, iteration)
    write_manifest(tmp)
    fsync_tree(tmp)
    if final.is_symlink():
        final.unlink()
    if final.exists():  # re-saving an iteration: swap in one step where the filesystem can
        if _exchange(tmp, final):  # tmp now holds the old iteration; final the new one, never neither
            shutil.rmtree(tmp)
        else:  # no RENAME_EXCHANGE (e.g. NFS): move the old one aside first (a kill between leaves it there)
            old = final.with_name(final.name + TMP_MARK + "old")
            if old.exists():
                shutil.rmtree(old)
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old)
    else:
        os.rename(tmp, final)
    fsync_dir(save_dir)
    if tracker:
        write_tracker(save_dir, iteration)
    if keep_last is not None and keep_last > 0:
        for old_iter in list_iterations(save_dir)[keep_last:]:
            shutil.rmtree(iter_dir(save_dir, old_iter), ignore_errors=True)
    return final


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two directories (Linux ``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(str(a)), at_fdcwd, os.fsencode(str(b)), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    import errno

    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def write_tracker(save_dir, iteration) -> None:
    """Megatron-LM's ``latest_checkpointed_iteration.txt`` (atomic; a symlink there is replaced)."""
    atomic_write_text(Path(save_dir) / TRACKER, f"{iteration}\n")


# ---- validation ---------------------------------------------------------------------------

def _check_zip(path: Path) -> None:
    try:
        with zipfile.ZipFile(path) as zf:
            bad = zf.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise CorruptCheckpointError(f"checkpoint file {path} is truncated or corrupted: {exc}") from None
    if bad is not None:
        raise CorruptCheckpointError(f"checkpoint file {path} is corrupted (CRC mismatch in {bad})")


def validate_iteration(load_dir, iteration) -> None:
    """Raise :class:`CorruptCheckpointError` (naming the file) unless the iteration is complete and intact:
    the checksum manifest (:mod:`verl_bridge.checkpoint.manifest`) when present, then the layout's
    own structure (zip CRCs of legacy files / common.pt, the torch_dist ``.metadata`` read through
    the restricted unpickler). A file needing a type outside the allowlist raises
    :class:`CheckpointError` (refused, never skipped)."""
    from verl_bridge.checkpoint.manifest import verify_manifest

    d = iter_dir(load_dir, iteration)
    if not d.is_dir():
        raise CorruptCheckpointError(f"checkpoint directory {d} is missing")
    verify_manifest(d)  # every file against its sha256 (when the directory has a manifest)
    if is_torch_dist_dir(d):
        for name in ("common.pt", ".metadata"):
            if not (d / name).is_file():
                raise CorruptCheckpointError(f"checkpoint file {d / name} is missing")
        _check_zip(d / "common.pt")
        from verl_bridge.checkpoint.safe_torch_dist import read_metadata

        read_metadata(d / ".metadata")  # CheckpointError (not skipped) for a type outside the allowlist
        if not list(d.glob("*.distcp")):
            raise CorruptCheckpointError(f"checkpoint directory {d} has no .distcp files")
        return
    rank_dirs = sorted(p for p in d.iterdir() if p.is_dir() and p.name.startswith("mp_rank_"))
    if not rank_dirs:
        raise CorruptCheckpointError(f"checkpoint directory {d} has no mp_rank_* directories")
    for rd in rank_dirs:
        if not (rd / LEGACY_FILE).is_file():
            raise CorruptCheckpointError(f"checkpoint file {rd / LEGACY_FILE} is missing")
        _check_zip(rd / LEGACY_FILE)


def latest_valid_iteration(load_dir) -> Optional[int]:
    """Newest complete, uncorrupted iteration under *load_dir* (None if there is none).

    Unfinished saves (``*.tmp-*``) are never considered; corrupted ones are skipped with a
    warning naming the file.
    """
    for it in list_iterations(load_dir):
        try:
            validate_iteration(load_dir, it)
            return it
        except CorruptCheckpointError as exc:
            log.warning("skipping checkpoint iteration %d: %s", it, exc)
    return None


# ---- load ---------------------------------------------------------------------------------

def _legacy_path(load_dir, iteration, ranks) -> Path:
    d = iter_dir(load_dir, iteration)
    candidates = [d / rank_dir_name(ranks["tp_rank"], ranks["pp_rank"], ranks["pp_size"], ranks.get("ep_rank", 0),
                                    ranks.get("ep_size", 1)) / LEGACY_FILE,
                  d / rank_dir_name(ranks["tp_rank"], ranks["pp_rank"], ranks["pp_size"]) / LEGACY_FILE,
                  d / f"mp_rank_{ranks['tp_rank']:02d}_{ranks['pp_rank']:03d}" / LEGACY_FILE,
                  d / f"mp_rank_{ranks['tp_rank']:02d}" / LEGACY_FILE]
    for c in candidates:
        if c.is_file():
            return c
    return candidates[0]


def _load_torch_dist(d: Path, model, ranks: dict, strict: bool, trust: bool = False,
                     model_only: bool = False) -> dict:
    """Read a torch_dist iteration through megatron-core with every pickle behind the allowlist
    (:mod:`verl_bridge.checkpoint.safe_torch_dist`); ``trust=True`` uses megatron-core's stock path."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    from verl_bridge.checkpoint import safe_torch_dist as std

    if model is None or not isinstance(model, torch.nn.Module):
        raise CheckpointError(f"loading the torch_dist checkpoint {d} needs model= (its sharded state dict)")
    std.read_metadata(d / std.METADATA_FILE, trust=trust)  # refuses a payload before megatron reads anything
    common = std.load_common(d, trust=trust)
    keys = common.get("verl_bridge_sharded_objects", ["rng_state"])
    sharded = {"model": model.sharded_state_dict()}
    args = common.get("args")
    saved_ep = getattr(args, "expert_model_parallel_size", 1) or 1
    if saved_ep != ranks.get("ep_size", 1):
        # saved at another expert-parallel size: megatron reshards the model (experts regrouped by
        # their global index); the per-rank optimizer / RNG objects belong to the saved layout
        model_only = True
    if model_only:  # a reader in another layout (convert's world of one) reads every saved rank's
        # objects (megatron wants them all; the same allowlisted reader)
        shape = (getattr(args, "pipeline_model_parallel_size", 1) or 1, getattr(args, "tensor_model_parallel_size", 1) or 1)
        if saved_ep > 1:
            shape = shape + (saved_ep,)
        import itertools

        for key in keys:
            for off in itertools.product(*(range(n) for n in shape)):
                # replica id: this rank (one main replica across the ranks reading, as megatron requires)
                sharded[f"{key}@{'.'.join(map(str, off))}"] = ShardedObject(key, None, shape, off,
                                                                            replica_id=ranks.get("rank", 0))
    else:
        shape, offset, replica = _object_sharding(ranks)
        for key in keys:
            sharded[key] = ShardedObject(key, None, shape, offset, replica_id=replica)
    try:
        if trust:
            log.warning("loading %s with trust=True: megatron-core's stock reader unpickles without restriction", d)
            with torch.serialization.safe_globals(safe_globals()):
                loaded = dist_checkpointing.load(sharded, str(d), **std.load_kwargs(trust=True))
        else:
            with std.mcore_safe_reading(d), torch.serialization.safe_globals(safe_globals()):
                loaded = dist_checkpointing.load(sharded, str(d), **std.load_kwargs())
    except CheckpointError:
        raise
    except BaseException as exc:  # noqa: BLE001 - torch's CheckpointException is a BaseException
        if not (isinstance(exc, Exception) or std.is_dcp_failure(exc)):
            raise  # KeyboardInterrupt, SystemExit
        inner = std.unwrap_dcp_failure(exc)
        if isinstance(inner, CheckpointError):
            raise inner from None
        raise CorruptCheckpointError(
            f"torch_dist checkpoint {d} could not be read: {type(inner).__name__}: {inner}") from None
    model.load_state_dict(loaded["model"], strict=strict)
    loaded.pop("verl_bridge_sharded_objects", None)
    if model_only:
        first = ".".join("0" * len(shape))
        for key in keys:
            loaded[key] = loaded.get(f"{key}@{first}")
        for name in [n for n in loaded if "@" in n]:
            del loaded[name]
    return loaded


def load(load_dir, iteration: Optional[int] = None, *, model=None, strict: bool = True, trust: bool = False,
         validated: bool = False, model_only: bool = False) -> dict:
    """This rank's state of iteration *iteration* (newest valid one when None).

    With ``model=`` the weights are also loaded into it (required for torch_dist, whose tensors
    are read through the model's sharded state dict, resharding across TP/PP as needed).
    The iteration is checked first (:func:`validate_iteration`; ``validated=True`` when the caller
    just did). When *iteration* is None and the newest checkpoint turns out unreadable, falls back to the
    previous valid one (logged). Raises :class:`CheckpointError` when nothing can be loaded, or
    when a file needs a type outside the safe-loading allowlist (never unpickled; ``trust=True``
    is the explicit opt-in for a trusted checkpoint). ``model_only=True`` (torch_dist): the weights into
    *model* at any layout; the optimizer and RNG objects returned are the saved layout's rank (0, 0).
    """
    load_dir = Path(load_dir)
    auto = iteration is None
    tried: list[str] = []
    candidates = [iteration] if not auto else list_iterations(load_dir)
    for it in candidates:
        try:
            if not validated:
                validate_iteration(load_dir, it)
            d = iter_dir(load_dir, it)
            ranks = _ranks()
            if is_torch_dist_dir(d):
                state = _load_torch_dist(d, model, ranks, strict, trust, model_only)
            else:
                state = safe_load(_legacy_path(load_dir, it, ranks), trust=trust)
                if model is not None:
                    model.load_state_dict(state["model"], strict=strict)
            return state
        except CorruptCheckpointError as exc:
            if not auto:
                raise
            tried.append(str(exc))
            log.warning("checkpoint iteration %s unusable, falling back: %s", it, exc)
    detail = ("; ".join(tried)) if tried else "no iter_* directories"
    raise CheckpointError(f"no loadable checkpoint in {load_dir} ({detail})")
