"""``cpu_device_shims()``: megatron-core's "the current device is CUDA" calls, answered on a CPU-only torch.

megatron-core 0.12-0.19 allocates several working tensors with ``device=torch.cuda.current_device()``
or ``device="cuda"`` inside module-level functions, with no argument to pass a device:

* sequence parallelism: ``tensor_parallel.mappings._gather_along_first_dim`` /
  ``_reduce_scatter_along_first_dim`` (the scatter/gather of the sequence dimension) and the
  ``GlobalMemoryBuffer`` the SP linear layers gather into;
* ``DotProductAttention`` (megatron's local-spec core attention): its score buffer from the
  ``GlobalMemoryBuffer``, its default causal mask (``get_default_causal_mask``, ``device="cuda"``);
* the schedules' token counter (``torch.zeros([], device="cuda")``);
* ``LanguageModule.setup_embeddings_and_output_layer`` with tied embeddings at PP > 1
  (``weight.data.cuda()`` before the all-reduce that makes both stages' copies equal);
* the CUDA RNG tracker's ``fork()`` (the embedding's dropout under sequence parallelism, and
  TP-sharded dropout) switches CUDA generator states that a CPU-only torch does not have.

On a torch built without CUDA (or a machine without a GPU) every one of those calls raises
(``AssertionError: Torch not compiled with CUDA enabled``). Within ``cpu_device_shims()``:

* ``torch.cuda.current_device()`` returns ``"cpu"`` (it could only raise here);
* tensor factories asked for a CUDA device, and ``Tensor.cuda()``, stay on the CPU
  (a ``TorchFunctionMode``);
* megatron's RNG tracker forks as its own ``InferenceCudaRNGStatesTracker`` does (a null
  context): on the CPU, dropout draws from the CPU generator, which ``seed_everything`` seeds.

So megatron's own functions run unchanged, on the CPU. The context is a no-op when CUDA is
available (nothing changes on a GPU), and it is entered only around verl-bridge's own calls into
megatron (model building, the forward/backward schedules, generation).
"""

from __future__ import annotations

import contextlib
import threading

import torch
from torch.overrides import TorchFunctionMode


def _is_cuda(device) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, int) and not isinstance(device, bool)


class _CudaToCpu(TorchFunctionMode):
    """Tensor factories with a CUDA ``device`` build on the CPU; ``Tensor.cuda()`` is the tensor itself."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0]
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs = dict(kwargs, device="cpu")
        return func(*args, **kwargs)


def _cpu_current_device():
    return "cpu"


_TRACKER_CLASSES: dict[type, type] = {}


def _cpu_tracker():
    """megatron's global RNG tracker with its class swapped for one whose ``fork`` is a null context;
    returns ``(tracker, original class)`` to restore, or None (nothing to swap)."""
    try:
        from megatron.core.tensor_parallel import random as mrandom
    except ImportError:
        return None
    tracker = mrandom.get_cuda_rng_tracker()
    cls = type(tracker)
    if cls in _TRACKER_CLASSES.values():
        return None
    if cls not in _TRACKER_CLASSES:
        _TRACKER_CLASSES[cls] = type(f"CpuSafe{cls.__name__}", (cls,),
                                     {"fork": lambda self, name=None: contextlib.nullcontext()})
    tracker.__class__ = _TRACKER_CLASSES[cls]
    return tracker, cls


_lock = threading.RLock()
_depth = 0
_saved = None
_saved_tracker = None


@contextlib.contextmanager
def cpu_device_shims():
    """See the module docstring. Re-entrant; a no-op where CUDA is available."""
    global _depth, _saved, _saved_tracker
    if torch.cuda.is_available():
        yield
        return
    with _lock:
        if _depth == 0:
            _saved = torch.cuda.current_device
            torch.cuda.current_device = _cpu_current_device
            _saved_tracker = _cpu_tracker()
        _depth += 1
    try:
        with _CudaToCpu():
            yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                torch.cuda.current_device = _saved
                _saved = None
                if _saved_tracker is not None:
                    tracker, cls = _saved_tracker
                    tracker.__class__ = cls
                    _saved_tracker = None
