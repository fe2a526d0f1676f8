"""Safe loading of Megatron checkpoint files: ``torch.load(weights_only=True)`` plus an allowlist.

Megatron-LM's ``model_optim_rng.pt`` and torch_dist ``common.pt`` hold, besides tensors and
plain containers: ``argparse.Namespace`` (``args``), numpy RNG state (``np.random.get_state()``:
an ndarray of uint32), ``pathlib`` paths inside args, and megatron-core enums that args or
``_extra_state`` may carry (ModelType, AttnBackend, AttnMaskType). Those, and only those, are
allowlisted in :data:`SAFE_GLOBALS`. A file that needs anything else is refused with a message
naming the type; ``trust=True`` loads it with full unpickling, and says so in a warning.

A truncated or corrupted file raises :class:`CorruptCheckpointError` naming the file.
"""

from __future__ import annotations

import argparse
import pathlib
import pickle
import warnings
from pathlib import Path
from typing import Iterable


class CheckpointError(RuntimeError):
    """A checkpoint could not be read; the message names the file and what to do."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint file is truncated, corrupted or missing."""


def _safe_globals() -> list:
    import numpy as np

    found: list = [argparse.Namespace, pathlib.PosixPath, pathlib.PurePosixPath, pathlib.WindowsPath,
                   pathlib.PureWindowsPath]
    # numpy RNG state (Megatron-LM rng_state['np_rng_state'])
    try:
        from numpy.core.multiarray import _reconstruct  # numpy < 2 path, kept as alias in 2.x
    except ImportError:  # pragma: no cover
        from numpy._core.multiarray import _reconstruct
    found += [_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32)), type(np.dtype(np.int64)),
              type(np.dtype(np.float64)), type(np.dtype(np.float32)), type(np.dtype(np.bool_))]
    for mod, names in (
        ("megatron.core.enums", ("ModelType",)),
        ("megatron.core.transformer.enums", ("AttnBackend", "AttnMaskType", "AttnType", "LayerType")),
    ):
        try:
            module = __import__(mod, fromlist=list(names))
        except ImportError:  # megatron not importable: nothing to allow
            continue
        found += [getattr(module, n) for n in names if hasattr(module, n)]
    return found


SAFE_GLOBALS = None  # filled lazily by safe_globals()


def safe_globals() -> list:
    global SAFE_GLOBALS
    if SAFE_GLOBALS is None:
        SAFE_GLOBALS = _safe_globals()
    return SAFE_GLOBALS


def refusal_message(where, unpickler_message: str) -> str:
    """The refusal of a file that needs a type outside the allowlist (same words in every format)."""
    import re

    found = (re.search(r"GLOBAL\s+([\w.]+)", unpickler_message)
             or re.search(r"but got <class '([\w.]+)'>", unpickler_message))
    what = found.group(1) if found else "an unknown type"
    return (f"checkpoint file {where} contains {what}, a type outside verl-bridge's safe-loading "
            "allowlist. If you trust this file, pass the type via extra_globals or load with trust=True.")


def is_refusal(unpickler_message: str) -> bool:
    """Whether torch's weights_only error is a type outside the allowlist (not damage): a GLOBAL it
    would not resolve, or an object of a type it would not build (e.g. a numpy object array)."""
    return any(w in unpickler_message for w in ("Unsupported global", "not an allowed global", "GLOBAL",
                                                "Can only build", "Unsupported class"))


def safe_load(path, *, extra_globals: Iterable = (), trust: bool = False, map_location="cpu"):
    """``torch.load`` of *path* with ``weights_only=True`` and the Megatron allowlist.

    Raises :class:`CorruptCheckpointError` for a missing / truncated / corrupted file and
    :class:`CheckpointError` for a file needing a type outside the allowlist.
    """
    import torch

    path = Path(path)
    if not path.is_file():
        raise CorruptCheckpointError(f"checkpoint file {path} is missing")
    if trust:
        warnings.warn(f"loading {path} with weights_only=False: arbitrary objects are unpickled", stacklevel=2)
        return torch.load(path, map_location=map_location, weights_only=False)
    try:
        with torch.serialization.safe_globals(list(safe_globals()) + list(extra_globals)):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        msg = str(exc)
        if is_refusal(msg):
            raise CheckpointError(refusal_message(path, msg)) from None
        raise CorruptCheckpointError(f"checkpoint file {path} is truncated or corrupted: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - whatever a damaged zip/pickle raises (EOFError, BadZipFile, ...)
        raise CorruptCheckpointError(
            f"checkpoint file {path} is truncated or corrupted: {type(exc).__name__}: {exc}") from None
