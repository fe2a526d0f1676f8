"""Regional ``torch.compile`` of megatron-core transformer layers (``trainer.args.compile_layers``).

Why: without Transformer Engine or apex, megatron-core's local spec runs RoPE, SwiGLU, the norms,
the residual adds and the ``[s, b, h, d]`` permutes around attention as separate eager kernels. On
the H100, for the Qwen2-0.5B shape, those were 56% of the actor update's GPU time (kernel_profile:
elementwise 22%, copy/index/cat 26%, norms 3%, GEMMs only 33%). Compiling each
``TransformerLayer`` -- the repeated block, as torchtitan does -- lets inductor fuse them; the GEMMs
and SDPA stay the same library calls. All layers share one compiled graph (the parameters are graph
inputs), so compile time does not grow with depth.

How: each layer's class is swapped for a subclass whose ``forward`` calls a compiled copy of the
original ``forward`` (the same mechanism as :mod:`verl_bridge.compat.cpu`), so ``state_dict`` keys,
``isinstance`` checks and the parameters read in place (the fast decoder, the weight exporter) are
unchanged, and every model computes with its own weights (they are graph inputs, not constants). A forward with a KV cache
(``inference_context`` / ``inference_params``: megatron's module decode path) runs eager: its
per-token shapes and Python bookkeeping would only recompile. If the first compiled call fails (a
machine without a working compiler toolchain), the layers run eager with one warning naming why.

When (``None``, the default, is *auto*): on CUDA, for layers built from verl-bridge's portable spec
(:class:`verl_bridge.models.spec.SDPAttention` core attention), dense, hidden size >= 512, at TP=1 -- the
case measured by
``benchmarks/kernel_profile.py``. ``true`` compiles any megatron ``TransformerLayer`` (CPU too: the
CPU tests use it); ``false`` never.

megatron-core calls ``warnings.warn`` inside the linear layers on every forward (``tp_group`` is
``None`` in ``RowParallelLinear._forward_impl``); under dynamo each call would split the graph, so
``warnings.warn`` is listed in ``torch._dynamo.config.ignore_logging_functions`` (older torch:
``reorderable_logging_functions``) while compiling. Eager calls still warn as before.
"""

from __future__ import annotations

import warnings
from typing import Optional

import torch

# auto leaves smaller models eager (the tiny quickstart model would spend longer compiling than training)
AUTO_MIN_HIDDEN = 512
_SUBCLASSES: dict[type, type] = {}
_COMPILED_FORWARD: dict[type, object] = {}
_WORKED: set = set()  # layer classes whose compiled forward ran once
_GAVE_UP: dict[type, str] = {}  # layer classes whose compilation failed: why (they run eager)


def transformer_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The megatron ``TransformerLayer`` modules of ``model`` (any wrapper, any depth)."""
    from megatron.core.transformer.transformer_layer import TransformerLayer

    return [m for m in model.modules() if isinstance(m, TransformerLayer)]


def auto_reason(model: torch.nn.Module, device: torch.device, tp_size: int) -> Optional[str]:
    """``None`` when *auto* compiles ``model``'s layers; otherwise why it leaves them eager."""
    if torch.device(device).type != "cuda":
        return "not on CUDA"
    if tp_size != 1:
        return f"tensor_model_parallel_size={tp_size} (auto compiles at TP=1, the measured case)"
    layers = transformer_layers(model)
    if not layers:
        return "no megatron TransformerLayer"
    from verl_bridge.models.spec import SDPAttention

    for layer in layers:
        core = getattr(getattr(layer, "self_attention", None), "core_attention", None)
        if not isinstance(core, SDPAttention):
            return f"{type(core).__name__} core attention (auto compiles verl-bridge's portable spec)"
        if getattr(layer.config, "num_moe_experts", None):
            return "mixture of experts (token routing has data-dependent shapes)"
    hidden = layers[0].config.hidden_size
    if hidden < AUTO_MIN_HIDDEN:
        return f"hidden_size={hidden} < {AUTO_MIN_HIDDEN}: too small for fusion to repay the compile time"
    return None


def _quiet_warn_under_dynamo() -> None:
    cfg = torch._dynamo.config
    ignore = getattr(cfg, "ignore_logging_functions", None)
    if isinstance(ignore, set):
        ignore.add(warnings.warn)
    else:  # older torch: moved after the graph (it then runs once per call, as in eager)
        cfg.reorderable_logging_functions.add(warnings.warn)


def _compiled_forward(base: type):
    fn = _COMPILED_FORWARD.get(base)
    if fn is None:
        fn = _COMPILED_FORWARD[base] = torch.compile(base.forward)
    return fn


def _give_up(base: type, exc: BaseException) -> None:
    reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    _GAVE_UP[base] = reason
    import logging

    logging.getLogger(__name__).warning(
        "compile_layers: torch.compile of %s failed (%s); its layers run eager. Set "
        "trainer.args.compile_layers: false to skip the attempt", base.__name__, reason)


def _subclass(base: type) -> type:
    sub = _SUBCLASSES.get(base)
    if sub is None:
        def forward(self, *args, **kwargs):
            if (kwargs.get("inference_context") is not None or kwargs.get("inference_params") is not None
                    or base in _GAVE_UP):
                return base.forward(self, *args, **kwargs)
            if base in _WORKED:
                return _compiled_forward(base)(self, *args, **kwargs)
            # the first call compiles: a machine whose compiler toolchain fails (no Triton for this GPU,
            # no C compiler, ...) runs the layers eager, saying so once, instead of ending the run; a
            # genuine error in the layer raises again from the eager call
            try:
                out = _compiled_forward(base)(self, *args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - re-raised by the eager call if it is not the compiler's
                _give_up(base, exc)
                return base.forward(self, *args, **kwargs)
            _WORKED.add(base)
            return out

        sub = _SUBCLASSES[base] = type(f"{base.__name__}_compiled", (base,), {"forward": forward,
                                                                             "_verl_compiled_from": base})
    return sub


def is_compiled(layer: torch.nn.Module) -> bool:
    return "_verl_compiled_from" in type(layer).__dict__


def compile_layers(model: torch.nn.Module, setting: Optional[bool], device, tp_size: int = 1) -> tuple[int, str]:
    """Apply ``trainer.args.compile_layers`` to ``model``: (layers compiled, why / why not)."""
    if setting is False:
        return 0, "compile_layers: false"
    if setting is None:
        reason = auto_reason(model, device, tp_size)
        if reason:
            return 0, f"compile_layers auto: eager ({reason})"
    layers = transformer_layers(model)
    if not layers:
        return 0, "no megatron TransformerLayer to compile"
    _quiet_warn_under_dynamo()
    n = 0
    for layer in layers:
        if not is_compiled(layer):
            layer.__class__ = _subclass(type(layer))
            n += 1
    return n, f"compile_layers: {n} transformer layers compiled (torch.compile, one shared graph)"
