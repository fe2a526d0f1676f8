"""MoE shims: megatron-core's MoE router made to run on the CPU (and without Transformer Engine).

Two CUDA / Transformer Engine assumptions in ``TopKRouter.gating`` (``megatron.core.transformer.moe``):

* ``ROUTER_GATING_MOVES_TO_CUDA`` (every version with MoE we checked: 0.16.1, 0.19.2): ``gating``
  moves the router weight to ``torch.cuda.current_device()`` whenever it sits on the CPU
  (``self.weight.data = self.weight.data.to(device=torch.cuda.current_device())``), which raises
  on a CPU-only torch ("Torch not compiled with CUDA enabled").
* ``ROUTER_TE_GEMM_UNBOUND`` (0.13 to 0.18, checked on 0.13.1 and 0.16.1): ``moe_utils.RouterGatingLinearFunction``
  tests ``te_general_gemm is not None``, but that name is only imported inside the ``try: import
  transformer_engine`` block, so without Transformer Engine the router's forward raises
  ``NameError: name 'te_general_gemm' is not defined``. 0.19 binds it to ``None`` in the
  ``except`` branch (checked on 0.19.2), which makes the torch fallback reachable again.

:func:`make_router_cpu_safe` swaps the class of each ``TopKRouter`` in a model verl-bridge (or the
user's provider) built for a subclass whose ``gating`` is the same linear map in plain torch
(``F.linear`` in the router dtype, ``moe_router_dtype`` honoured), leaving the weight where it is:
the same maths as megatron's torch fallback (``torch.mm(inp.to(dtype), weight.to(dtype).t())``),
differentiable through autograd. Applied where CUDA is missing, or where Transformer Engine is
missing on a megatron-core whose router needs it (0.16); otherwise the model is left alone.
Nothing in megatron's modules is patched.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from verl_bridge.compat.mcore_versions import mcore_version

# megatron-core versions (major, minor) whose RouterGatingLinearFunction reads an unbound
# te_general_gemm without Transformer Engine: checked on 0.13.1 and 0.16.1 (unbound) and 0.19.2 (bound
# to None); 0.14, 0.15, 0.17 and 0.18 were not checked and are treated as their neighbours (the shim computes the same
# linear map as megatron's torch fallback, so applying it where it is not needed changes nothing)
ROUTER_TE_GEMM_UNBOUND = ((0, 13), (0, 18))
ROUTER_GATING_MOVES_TO_CUDA = ((0, 12), (0, 19))

_ROUTER_CLASSES: dict[type, type] = {}


def _have_te() -> bool:
    try:
        from megatron.core.transformer.moe import moe_utils
    except ImportError:
        return False
    return bool(getattr(moe_utils, "HAVE_TE", False))


def router_needs_shim() -> bool:
    """Whether :func:`make_router_cpu_safe` changes anything on this machine and megatron-core."""
    if not torch.cuda.is_available():
        return True
    lo, hi = ROUTER_TE_GEMM_UNBOUND
    return lo <= mcore_version() <= hi and not _have_te()


def _router_dtype(config, input_dtype: torch.dtype) -> torch.dtype:
    d = getattr(config, "moe_router_dtype", None)
    return {"fp32": torch.float32, "fp64": torch.float64}.get(d, input_dtype)


def _cpu_safe_router_class(base: type) -> type:
    class CpuSafeRouter(base):  # type: ignore[misc, valid-type]
        def gating(self, input: torch.Tensor) -> torch.Tensor:
            dtype = _router_dtype(self.config, input.dtype)
            bias = getattr(self, "bias", None)
            return F.linear(input.to(dtype), self.weight.to(dtype), None if bias is None else bias.to(dtype))

    CpuSafeRouter.__name__ = f"CpuSafe{base.__name__}"
    return CpuSafeRouter


def make_router_cpu_safe(model: torch.nn.Module) -> int:
    """Swap each megatron ``TopKRouter`` of *model* for its CPU-safe subclass (see the module
    docstring); returns how many were swapped. A no-op for dense models and where no shim is needed."""
    if not router_needs_shim():
        return 0
    try:
        from megatron.core.transformer.moe.router import TopKRouter
    except ImportError:
        return 0
    n = 0
    for module in model.modules():
        cls = type(module)
        if not isinstance(module, TopKRouter) or cls.__name__.startswith("CpuSafe"):
            continue
        if cls not in _ROUTER_CLASSES:
            _ROUTER_CLASSES[cls] = _cpu_safe_router_class(cls)
        module.__class__ = _ROUTER_CLASSES[cls]
        n += 1
    return n


def is_moe_model(model: torch.nn.Module) -> bool:
    while isinstance(getattr(model, "module", None), torch.nn.Module):  # DDP / Float16Module wrappers
        model = model.module
    return getattr(getattr(model, "config", None), "num_moe_experts", None) is not None


def is_expert_param(p: torch.nn.Parameter) -> bool:
    """megatron's mark of an expert-parallel parameter (``allreduce = False``: its gradient is
    reduced over the expert-data-parallel group, not the data-parallel one)."""
    return not getattr(p, "allreduce", True)
