"""Models in the precision Megatron-LM's ``get_model()`` gives them (``--bf16`` / ``--fp16``).

Megatron-LM builds every model through ``megatron.training.get_model()``, which, with ``--bf16``
or ``--fp16``, wraps the provider's model in megatron-core's ``Float16Module``. Its constructor
casts the *whole* module (``module.bfloat16()`` / ``module.half()``): the linear weights that
``params_dtype`` already made bf16, and also what ``params_dtype`` leaves in fp32, such as the
local spec's ``LayerNorm`` and ``torch.nn.Embedding`` for learned absolute positions. The
optimizer keeps fp32 master copies (verl-bridge's does too).

A provider's raw model is therefore mixed-dtype; Megatron-LM never runs it that way. The bridge
applies the same cast, in place, to the model itself (:func:`cast_like_float16_module`) rather than
keeping the wrapper object, because verl-bridge's roles work on the ``GPTModel`` directly (its
parameter names are the checkpoint keys, the critic swaps its ``output_layer``). What the wrapper's
forward adds on top, logits returned in fp32, verl-bridge does where logits are consumed (log-probs,
entropy and sampling all compute in fp32).

Which precision: the model's own ``TransformerConfig`` (``bf16`` / ``fp16``), which Megatron-LM
fills from the same ``--bf16`` / ``--fp16`` flags that make ``get_model()`` wrap, checked against
``trainer.precision`` (:func:`resolve_precision`).
"""

from __future__ import annotations

from typing import Optional

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class PrecisionMismatchError(ValueError):
    pass


def model_precision(model: torch.nn.Module) -> Optional[str]:
    """``"bf16"`` / ``"fp16"`` / ``"fp32"`` from a megatron model's TransformerConfig; None without one."""
    from verl_bridge.compat import unwrap_model

    config = getattr(unwrap_model(model), "config", None)
    if config is None or not hasattr(config, "bf16"):
        return None
    if getattr(config, "fp16", False):
        return "fp16"
    return "bf16" if config.bf16 else "fp32"


def resolve_precision(model: torch.nn.Module, requested: str) -> tuple[str, Optional[str]]:
    """The precision to run ``model`` in, and an info line when it differs from ``trainer.precision``.

    The model's config decides (as ``args.bf16`` does in Megatron-LM). ``trainer.precision`` bf16/fp16
    for a model whose config says otherwise is an error: the model would silently run in another
    precision than the config asks for.
    """
    built = model_precision(model)
    if built is None:
        return requested, None
    if requested != "fp32" and built != requested:
        raise PrecisionMismatchError(
            f"trainer.precision={requested} but model_provider built a model whose TransformerConfig says "
            f"{built} (bf16={model_precision_flag(model, 'bf16')}, fp16={model_precision_flag(model, 'fp16')}); "
            f"build it with {requested}=True (Megatron-LM: --{requested}) or set trainer.precision: {built}")
    if built != requested:
        return built, (f"the model's TransformerConfig is {built} (Megatron-LM --{built}); running it in {built} "
                       f"as Megatron-LM's get_model() does (trainer.precision is {requested}; set it to {built} "
                       "to silence this)")
    return built, None


def model_precision_flag(model: torch.nn.Module, flag: str) -> bool:
    from verl_bridge.compat import unwrap_model

    return bool(getattr(getattr(unwrap_model(model), "config", None), flag, False))


def cast_like_float16_module(model: torch.nn.Module, precision: str) -> torch.nn.Module:
    """Cast every floating parameter and buffer to ``precision``, as ``Float16Module.__init__`` does.

    fp32 leaves the model as built (Megatron-LM does not wrap it either). Returns ``model``.
    """
    if precision == "bf16":
        return model.bfloat16()
    if precision == "fp16":
        return model.half()
    return model


def parameter_dtypes(model: torch.nn.Module) -> dict[torch.dtype, list[str]]:
    """Floating parameter names grouped by dtype (a model Megatron-LM would run has one group)."""
    out: dict[torch.dtype, list[str]] = {}
    for name, p in model.named_parameters():
        if p.is_floating_point():
            out.setdefault(p.dtype, []).append(name)
    return out
