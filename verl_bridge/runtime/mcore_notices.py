"""megatron-core's known start-up notices, folded into one ``[INFO]`` line.

Without Transformer Engine or apex, importing megatron-core's optimizer, clip_grads, norm backends
and layer specs warns seven times that it falls back to torch ("Transformer Engine and Apex are not
installed. Falling back to Torch optimizers", "... to Torch Norm", "... to local implementations of
multi_tensor_applier ..."), and 0.16's ``TransformerConfig`` warns about its own ``cuda_graph_scope``
default ("full scope is deprecated"). They are expected on a CPU or a plain-pip install, so a run
collects them here and the logging rank prints what is in use, once::

    [INFO] megatron-core 0.16.1, no TE/apex: torch norm, torch optimizers, local multi-tensor kernels (...)

The TP>1 advice to set ``CUDA_DEVICE_MAX_CONNECTIONS`` (``tensor_parallel/layers.py``, at the first
backward) is dropped too where there is no CUDA, and kept on a GPU. Only those messages, raised
from inside ``megatron/core``, are folded; every other warning is
shown as Python would show it. ``verl-bridge train -v`` or ``VERL_BRIDGE_VERBOSE=1`` shows them
all in full as well. Every rank installs the same hook (so no rank prints them); the logging rank
prints the line (:func:`summary`).
"""

from __future__ import annotations

import importlib.util
import os
import re
import warnings
from importlib import metadata
from typing import Optional

VERBOSE_ENV = "VERL_BRIDGE_VERBOSE"
# (pattern, what is in use instead; None: a notice about megatron-core's own default, nothing to name)
KNOWN = (
    (re.compile(r"(Transformer Engine|Apex)( and Apex)? (is|are) not installed\. Falling back to (?P<what>.+)",
                re.S), "fallback"),
    # 0.16 says "cuda_graph_scope", 0.19.2 "cuda_graph_modules"
    (re.compile(r"full scope is deprecated\. Use empty cuda_graph_(scope|modules)"), None),
    # megatron-core 0.19's hyper_comm_grid.py at import: it logs through the standard logging module instead
    (re.compile(r"absl\.logging is not installed\. Using logging\.getLogger"), None),
    # tensor_parallel/layers.py, first TP>1 backward: CUDA stream advice, moot without CUDA (kept on a GPU)
    (re.compile(r"set the environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1"), "cpu-only"),
)
# torch's FutureWarnings about APIs that megatron-core itself calls (not the user's code): torch >= 2.13
# deprecates the two collectives its TP/SP mappings use on every SP forward, and torch's distributed
# checkpoint deprecates ``load_state_dict`` / ``save_state_dict`` and ShardedTensor, which megatron's
# torch_dist strategy uses on every save and load. They are raised inside torch (``c10d_logger.py``,
# ``typing_extensions``, the DCP planner), so they are matched by category and text, not by a megatron
# path; verl-bridge's own code already calls the ``*_single`` collectives where torch has them.
# (pattern, the label the [INFO] line names)
TORCH_DEPRECATIONS = (
    (re.compile(r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated\. "
                r"Please use `torch\.distributed\.(all_gather_single|reduce_scatter_single)` instead"),
     "all_gather_into_tensor / reduce_scatter_tensor (megatron-core's TP/SP code)"),
    (re.compile(r"^`(load_state_dict|save_state_dict)` is deprecated and will be removed in future versions\. "
                r"Please use `(load|save)` instead"),
     "DCP load_state_dict / save_state_dict (megatron-core's torch_dist checkpoints)"),
    (re.compile(r"^Please use DTensor instead and we are deprecating ShardedTensor\.$"),
     "ShardedTensor (megatron-core's torch_dist checkpoints)"),
)
COLLECTIVES_LABEL = TORCH_DEPRECATIONS[0][1]


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
_MCORE_DIR = os.sep + os.path.join("megatron", "core") + os.sep


def _in_use(what: str) -> str:
    w = what.strip().rstrip(".")
    if w.lower().startswith("local implementations of multi_tensor"):
        return "local multi-tensor kernels"
    return w.lower()


class _Collector:
    def __init__(self) -> None:
        self.original = None
        self.seen: list[str] = []  # messages folded, in order (each text once)
        self.count = 0
        self.verbose = False
        self.reported = False

    def show(self, message, category, filename, lineno, file=None, line=None):
        text = str(message)
        if _known(text, category, filename):
            self.count += 1
            if text not in self.seen:
                self.seen.append(text)
            if not self.verbose:
                return
        self.original(message, category, filename, lineno, file, line)


def _known(text: str, category, filename) -> bool:
    """A megatron-core notice of :data:`KNOWN` raised from inside ``megatron/core``, or one of torch's
    :data:`TORCH_DEPRECATIONS` (raised inside torch, so matched by category and text alone)."""
    if issubclass(category, UserWarning) and _MCORE_DIR in os.path.abspath(filename or ""):
        return any(pattern.search(text) and not (kind == "cpu-only" and _cuda()) for pattern, kind in KNOWN)
    if issubclass(category, FutureWarning):
        return any(pattern.search(text) for pattern, _ in TORCH_DEPRECATIONS)
    return False


_collector: Optional[_Collector] = None


def verbose_requested() -> bool:
    return os.environ.get(VERBOSE_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def install(verbose: Optional[bool] = None) -> None:
    """Fold megatron-core's known notices from now on (idempotent; call before megatron is imported)."""
    global _collector
    if _collector is None:
        _collector = _Collector()
        _collector.original = warnings.showwarning
        warnings.showwarning = _collector.show
    _collector.verbose = verbose_requested() if verbose is None else verbose


def uninstall() -> None:
    """Restore Python's own ``warnings.showwarning`` (tests)."""
    global _collector
    if _collector is not None and warnings.showwarning == _collector.show:
        warnings.showwarning = _collector.original
    _collector = None


def _backends() -> str:
    te = importlib.util.find_spec("transformer_engine") is not None
    apex = importlib.util.find_spec("apex") is not None
    if te and apex:
        return "TE and apex installed"
    if not te and not apex:
        return "no TE/apex"
    return "no TE" if not te else "no apex"


def _torch_deprecates_collectives() -> bool:
    import torch.distributed as dist

    return hasattr(dist, "reduce_scatter_single") and hasattr(dist, "all_gather_single")


def summary() -> Optional[str]:
    """The one line for what was folded so far (None: nothing folded, or already reported)."""
    c = _collector
    if c is None or not c.seen or c.reported:
        return None
    c.reported = True
    uses: list[str] = []
    notices = 0
    for text in c.seen:
        for pattern, kind in KNOWN:
            m = pattern.search(text)
            if m is None:
                continue
            if kind == "cpu-only":
                continue
            if kind is None:
                notices += 1
            elif _in_use(m.group("what")) not in uses:
                uses.append(_in_use(m.group("what")))
            break
    try:
        version = metadata.version("megatron-core")
    except metadata.PackageNotFoundError:
        version = "?"
    line = f"megatron-core {version}, {_backends()}"
    if uses:
        line += ": " + ", ".join(uses)
    extra = f", {notices} about a default of its own (cuda_graph_scope)" if notices else ""
    labels = {label for text in c.seen for pattern, label in TORCH_DEPRECATIONS if pattern.search(text)}
    if _torch_deprecates_collectives():
        labels.add(COLLECTIVES_LABEL)  # usually raised later, at the first TP/SP forward: named here already
    if labels:
        extra += "; torch's FutureWarnings on what megatron-core calls are folded too: " + ", ".join(sorted(labels))
    how = "shown above" if c.verbose else f"-v or {VERBOSE_ENV}=1 shows them"
    return line + f" ({c.count} start-up warnings folded into this line{extra}; {how})"
