"""Architecture registry: declarative HF <-> megatron-core name maps, one spec per architecture.

An :class:`~verl_bridge.arch.spec.ArchSpec` (in :mod:`.spec`, which the per-architecture modules
import; only this module imports them) is data. ``from_hf`` maps a Hugging Face parameter name template to a
megatron-core ``GPTModel`` name template (``{}`` is the layer index, torchtitan style; ``{e}`` the
global expert index of a Mixture-of-Experts layer):

* ``"hf.name": "mcore.name"``              one tensor to one tensor,
* ``"hf.name": ("mcore.name", "q")``       one part of a fused megatron tensor (``q``/``k``/``v`` of
  ``linear_qkv``, ``gate``/``up`` of a gated ``linear_fc1``); the fusion itself is code
  (:mod:`verl_bridge.arch.fused`),
* ``"hf.name": None``                      an HF tensor megatron has no use for (dropped).

Register a custom architecture in a few lines::

    from verl_bridge.arch import ArchSpec, register_architecture
    from verl_bridge.arch.llama import LLAMA
    register_architecture("my_llama", dataclasses.replace(
        LLAMA, name="my_llama", hf_architectures=("MyLlamaForCausalLM",), hf_model_type="my_llama"))

Detection (:func:`detect_architecture`) compares a megatron ``TransformerConfig`` (and the
model's structure) with each spec's ``features``; custom registrations are tried first.
"""

from __future__ import annotations

from typing import Union

from verl_bridge.arch import llama, mistral, mixtral, opt, qwen2, qwen2_moe, qwen3_moe
from verl_bridge.arch.moe import MOE_ARCHS, unsupported_hf_reason, unsupported_mcore_features
from verl_bridge.arch.spec import ArchSpec

_REGISTRY: dict[str, ArchSpec] = {}
# detection order: most specific first
_BUILTINS = ("qwen2_moe", "qwen3_moe", "mixtral", "qwen2", "mistral", "llama", "opt")


def _load_builtins() -> None:
    if all(n in _REGISTRY for n in _BUILTINS):
        return
    for spec in (qwen2_moe.QWEN2_MOE, qwen3_moe.QWEN3_MOE, mixtral.MIXTRAL, qwen2.QWEN2, mistral.MISTRAL,
                 llama.LLAMA, opt.OPT):
        _REGISTRY.setdefault(spec.name, spec)


def spec_has_experts(spec: ArchSpec) -> bool:
    """Whether the spec maps Mixture-of-Experts tensors (a ``{e}`` expert placeholder in its map)."""
    return any("{e}" in (t if isinstance(t, str) else t[0]) for t in spec.from_hf.values() if t is not None)


def register_architecture(name: str, spec: ArchSpec) -> ArchSpec:
    """Register (or replace) the architecture *name*. Returns the stored spec."""
    if not isinstance(spec, ArchSpec):
        raise TypeError(f"register_architecture({name!r}, ...) needs an ArchSpec, got {type(spec).__name__}")
    if spec.name != name:
        from dataclasses import replace

        spec = replace(spec, name=name)
    _load_builtins()
    _REGISTRY[name] = spec
    return spec


def get_arch(name_or_spec: Union[str, ArchSpec]) -> ArchSpec:
    if isinstance(name_or_spec, ArchSpec):
        return name_or_spec
    _load_builtins()
    if name_or_spec in _REGISTRY:
        return _REGISTRY[name_or_spec]
    for spec in _REGISTRY.values():
        if name_or_spec in spec.hf_architectures or name_or_spec == spec.hf_model_type:
            return spec
    reason = unsupported_hf_reason([name_or_spec])
    if reason:
        raise ValueError(reason)
    raise ValueError(
        f"unknown architecture {name_or_spec!r}; known: {', '.join(sorted(_REGISTRY))} "
        "(register a new one with verl_bridge.arch.register_architecture)"
    )


def all_archs() -> list[ArchSpec]:
    """Custom registrations first (most recent first), then the built-ins."""
    _load_builtins()
    custom = [s for n, s in _REGISTRY.items() if n not in _BUILTINS]
    return list(reversed(custom)) + [_REGISTRY[n] for n in _BUILTINS]


def _features_of(obj) -> dict:
    """Detection features from a GPTModel, a TransformerConfig, or an HF config."""
    model = None
    if hasattr(obj, "config") and hasattr(obj, "modules") and hasattr(obj, "decoder"):
        model, config = obj, obj.config
    else:
        config = obj
    feats = {
        "normalization": getattr(config, "normalization", None),
        "gated_linear_unit": getattr(config, "gated_linear_unit", None),
        "add_qkv_bias": getattr(config, "add_qkv_bias", None),
        "add_bias_linear": getattr(config, "add_bias_linear", None),
        "num_query_groups": getattr(config, "num_query_groups", None),
        "qk_layernorm": getattr(config, "qk_layernorm", None),
    }
    if hasattr(config, "num_moe_experts"):  # Mixture-of-Experts: what tells the MoE maps apart
        moe = config.num_moe_experts is not None
        feats["moe"] = moe
        if moe:
            shared = getattr(config, "moe_shared_expert_intermediate_size", None) is not None
            feats.update(moe_shared_expert=shared,
                         moe_shared_expert_gate=bool(getattr(config, "moe_shared_expert_gate", False)) and shared,
                         moe_router_pre_softmax=bool(getattr(config, "moe_router_pre_softmax", False)))
    if model is not None:
        feats["position_embedding_type"] = getattr(model, "position_embedding_type", None)
        feats["share_embeddings_and_output_weights"] = getattr(model, "share_embeddings_and_output_weights", None)
        rotary = getattr(model, "rotary_pos_emb", None)
        if rotary is not None and hasattr(rotary, "inv_freq"):
            inv = rotary.inv_freq
            # inv_freq[1] = base ** (-2 / dim)  ->  base
            if inv.numel() > 1:
                dim = 2 * inv.numel()
                feats["rotary_base"] = float(round(float(inv[1].double() ** (-dim / 2.0))))
    for key in ("position_embedding_type", "rotary_base", "share_embeddings_and_output_weights"):
        if feats.get(key) is None and getattr(config, key, None) is not None:
            feats[key] = getattr(config, key)
    return feats


def detect_architecture(model_or_config) -> str:
    """Name of the registered architecture that a model / TransformerConfig / HF config matches.

    An HF config (it has ``architectures`` or ``model_type``) is looked up by name. A megatron
    model or config is matched on ``normalization``, ``gated_linear_unit``, ``add_qkv_bias``,
    ``add_bias_linear``, ``position_embedding_type`` and, where a spec lists it, ``rotary_base``.
    Llama and Mistral share one weight layout; Mistral is chosen only when ``rotary_base`` is
    1e6 (Mistral v0.2+), otherwise Llama (the exported weights are identical either way).

    Mixture-of-Experts (``num_moe_experts`` set): only maps with experts (a ``{e}`` placeholder)
    match, told apart by shared expert, its gate, q/k norm, QKV bias and the router's
    renormalisation; MoE features no built-in map covers (see :mod:`verl_bridge.arch.moe`) raise
    ``ValueError`` naming them, and so do HF architectures known to be outside the maps
    (DeepSeek-V3, GLM-4.5, ...).
    """
    archs = getattr(model_or_config, "architectures", None)
    if archs or isinstance(getattr(model_or_config, "model_type", None), str):
        for a in list(archs or []) + [getattr(model_or_config, "model_type", "")]:
            try:
                return get_arch(a).name
            except ValueError:
                continue
        raise ValueError(unsupported_hf_reason(archs or []) or f"no registered architecture for HF architectures={archs}")
    feats = _features_of(model_or_config)
    config = getattr(model_or_config, "config", model_or_config)
    unsupported = unsupported_mcore_features(config) if feats.get("moe") else []
    for spec in all_archs():
        if spec.name in _BUILTINS and unsupported:  # custom maps had their turn: a built-in one would
            # convert this model's tensors but not its maths
            raise ValueError("this Mixture-of-Experts model uses " + "; ".join(unsupported)
                             + f", which the MoE maps ({', '.join(MOE_ARCHS)}) do not cover. Register an "
                             "architecture for it with verl_bridge.arch.register_architecture.")
        if feats.get("moe") is not None and feats["moe"] != spec_has_experts(spec):
            continue  # a dense map never matches an MoE model, nor an MoE map a dense one
        ok = True
        for key, want in spec.features.items():
            have = feats.get(key)
            if have is None:
                if key == "rotary_base":  # a spec that needs a base cannot match without one
                    ok = False
                    break
                continue  # unknown on this object: do not rule out
            if key == "rotary_base":
                ok = abs(float(have) - float(want)) <= 1e-6 * float(want)
            else:
                ok = have == want
            if not ok:
                break
        if ok:
            return spec.name
    raise ValueError(
        "no registered architecture matches this model: "
        + ", ".join(f"{k}={v}" for k, v in feats.items())
        + ". Register one with verl_bridge.arch.register_architecture."
    )
