"""Sequence parallelism and the user's model: norms that can run it, refused by name when they cannot.

With ``sequence_parallel`` each TP rank normalises its own slice of the sequence, so every norm's
weights must be tagged ``sequence_parallel = True`` (as megatron's TENorm and apex FusedLayerNorm
tag them, and :class:`verl_bridge.models.spec.PortableNorm`): ``finalize_model_grads`` sums only
tagged gradients over TP. Two ways a provider's model can fail that, both refused here with the
module named and what would work, the same way on every rank:

* megatron's torch norm (``WrappedTorchNorm``: the local spec's norm without apex or TE) asserts
  at construction (``AssertionError: sequence parallel not supported by torch LayerNorm``):
  :func:`sequence_parallel_build` turns that into :class:`SequenceParallelNormError`;
* a norm that builds but is not tagged (a plain ``torch.nn.LayerNorm`` in a custom spec) would
  train with each TP rank's partial gradient: :func:`check_sequence_parallel_norms`.
"""

from __future__ import annotations

import contextlib

import torch

from verl_bridge.compat.cpu_device import cpu_device_shims

WHAT_WORKS = ("use an SP-capable norm: verl_bridge.models.spec.PortableNorm (torch LayerNorm/RMSNorm, "
              "SP-tagged; get_portable_gpt_layer_spec / get_portable_gpt_block_spec use it), "
              "Transformer Engine's TENorm or apex's FusedLayerNorm, or set trainer.args.sequence_parallel=false")


class SequenceParallelNormError(RuntimeError):
    pass


@contextlib.contextmanager
def sequence_parallel_build(provider: str):
    """Around a model provider call: the CPU device shims, and megatron's torch-norm SP assertion
    turned into a :class:`SequenceParallelNormError` naming ``provider``."""
    try:
        with cpu_device_shims():
            yield
    except AssertionError as exc:
        if "sequence parallel not supported" not in str(exc):
            raise
        raise SequenceParallelNormError(
            f"trainer.args.sequence_parallel=true, but the model from {provider} uses megatron-core's "
            f"WrappedTorchNorm (megatron.core.transformer.torch_norm: the local spec's norm without "
            f"Transformer Engine or apex), which cannot run sequence-parallel ({exc}); {WHAT_WORKS}"
        ) from None


_NORM_TYPES = ("LayerNorm", "RMSNorm", "FusedLayerNorm", "TENorm", "FusedRMSNorm", "L2Norm")


def _is_norm(module: torch.nn.Module) -> bool:
    return isinstance(module, (torch.nn.LayerNorm, torch.nn.RMSNorm)) or type(module).__name__ in _NORM_TYPES


def untagged_norms(model: torch.nn.Module) -> list[str]:
    """Names of the norm modules whose weights lack megatron's ``sequence_parallel`` tag."""
    out = []
    for name, module in model.named_modules():
        if not _is_norm(module) or "q_layernorm" in name or "k_layernorm" in name:
            continue  # q/k norms see whole heads: megatron reduces them through qk_layernorm, not SP
        params = list(module.parameters(recurse=False))
        if params and not all(getattr(p, "sequence_parallel", False) for p in params):
            out.append(f"{name} ({type(module).__module__}.{type(module).__qualname__})")
    return out


def check_sequence_parallel_norms(model: torch.nn.Module, provider: str) -> None:
    """Refuse a sequence-parallel model with an untagged norm (see the module docstring)."""
    from verl_bridge.compat import unwrap_model

    m = unwrap_model(model)
    config = getattr(m, "config", None)
    if not getattr(config, "sequence_parallel", False):
        return
    bad = untagged_norms(m)
    if bad:
        shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise SequenceParallelNormError(
            f"trainer.args.sequence_parallel=true, but the model from {provider} has norms whose weights are "
            f"not tagged for sequence parallelism: {shown}. Each TP rank would train them on its slice of "
            f"the sequence only; {WHAT_WORKS}")
