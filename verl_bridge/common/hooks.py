"""Calling user hooks whatever their signature (``model_provider``, ``load_checkpoint``).

Accepted ``model_provider`` signatures (pinned by tests/bridge/test_hook_contracts.py):

=====================================================================  ==========================
signature                                                               seen in
=====================================================================  ==========================
``(pre_process=True, post_process=True)``                               Megatron-LM <= core 0.12
``(pre_process, post_process, vp_stage=None)``                          Megatron-LM, core >= 0.13
``(config, pre_process, post_process, ...)``                            megatron-core-only scripts
``(model_builder, pre_process, post_process, vp_stage, config, pg_collection)``  Megatron-LM root ``model_provider.py`` (2025+)
``()``                                                                  simple scripts
=====================================================================  ==========================
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional

ACCEPTED_PROVIDER_SIGNATURES = (
    "(pre_process, post_process)",
    "(pre_process, post_process, vp_stage)",
    "(config, pre_process, post_process, ...)",
    "(model_builder, pre_process, post_process, vp_stage, config, pg_collection)",
    "()",
)


class HookSignatureError(TypeError):
    pass


def _describe(fn: Callable) -> str:
    try:
        return f"{getattr(fn, '__qualname__', fn)}{inspect.signature(fn)}"
    except (TypeError, ValueError):
        return repr(fn)


def call_model_provider(
    fn: Callable,
    pre_process: bool = True,
    post_process: bool = True,
    *,
    vp_stage: Optional[int] = None,
    config: Any = None,
    pg_collection: Any = None,
    model_builder: Optional[Callable] = None,
):
    """Call a user's ``model_provider`` with the arguments its signature asks for."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return fn(pre_process, post_process)
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    has_var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    available = {
        "pre_process": pre_process, "post_process": post_process, "vp_stage": vp_stage,
        "config": config, "pg_collection": pg_collection, "model_builder": model_builder,
    }
    if names and names[0] == "model_builder":
        if model_builder is None:
            raise HookSignatureError(
                f"model_provider {_describe(fn)} takes a model_builder first (Megatron-LM's root "
                "model_provider); pass model_builder= (e.g. Megatron-LM's gpt_builder) to MegatronBridge"
            )
    unknown = [
        p.name for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in available
        and p.default is inspect.Parameter.empty
    ]
    if unknown:
        raise HookSignatureError(
            f"unsupported model_provider signature {_describe(fn)}: required parameter(s) "
            f"{', '.join(unknown)} are not ones verl-bridge can supply. Accepted signatures: "
            + "; ".join(ACCEPTED_PROVIDER_SIGNATURES)
        )
    if "config" in names and config is None:
        required = next(p for p in params if p.name == "config").default is inspect.Parameter.empty
        if required:
            raise HookSignatureError(
                f"model_provider {_describe(fn)} needs a TransformerConfig as 'config'; "
                "set model.actor.args to describe the model or pass config= to MegatronBridge"
            )
    kwargs = {n: available[n] for n in names if n in available}
    if has_var_kw:
        kwargs.setdefault("pre_process", pre_process)
        kwargs.setdefault("post_process", post_process)
    return fn(**kwargs)


LOADER_SIGNATURES = (
    "(model, optimizer, opt_param_scheduler)",
    "(model, path)",
    "(model)",
)


def call_load_checkpoint(fn: Callable, model, optimizer=None, scheduler=None, path: Optional[str] = None):
    """Call a user's ``load_checkpoint`` with the signature it has.

    ``(model, optimizer, opt_param_scheduler)`` (Megatron-LM; frozen roles get ``None, None``),
    ``(model, path)``, or ``(model)``. Megatron-LM passes ``model`` as a list of chunks; we pass
    what the user's own code used (a list) unless the parameter is annotated otherwise.
    """
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names = [p.name for p in params]
    if len(names) >= 3 or {"optimizer", "opt_param_scheduler"} & set(names):
        return fn(model, optimizer, scheduler)
    if len(names) == 2:
        if path is None:
            raise HookSignatureError(
                f"load_checkpoint {_describe(fn)} takes a path; set model.actor.args.load_path"
            )
        return fn(model, path)
    if len(names) == 1:
        return fn(model)
    raise HookSignatureError(
        f"unsupported load_checkpoint signature {_describe(fn)}; accepted: " + "; ".join(LOADER_SIGNATURES)
    )


def provider_accepts(fn, name: str) -> bool:
    """Whether the hook ``fn`` takes a parameter called ``name`` (False when its signature is unreadable)."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
