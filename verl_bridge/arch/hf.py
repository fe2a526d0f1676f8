"""Hugging Face side: config translation, safetensors reading/writing, model provider, weight loading.

``hf_to_mcore_config`` turns a local HF directory (or config) into megatron-core
``TransformerConfig`` kwargs and ``GPTModel`` kwargs (padded vocabulary, positions, RoPE base,
tied embeddings, the portable SDPA layer spec). ``load_hf_weights`` fills the current rank's
TP/PP shard of a built ``GPTModel`` straight from the safetensors files (lazily, one tensor at a
time); ``hf_model_provider`` builds and loads in one call.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional

import torch

from verl_bridge.arch.convert import (
    ModelDims,
    hf_to_mcore,
    padded_vocab_size,
    shard_for_tp,
    to_global_name,
)
from verl_bridge.arch.registry import ArchSpec, get_arch
from verl_bridge.checkpoint.layout import is_inside

# TransformerConfig flags that keep megatron-core's local spec off CUDA-only fused paths.
PORTABLE_FLAGS = dict(
    use_cpu_initialization=True,
    bias_dropout_fusion=False,
    masked_softmax_fusion=False,
    gradient_accumulation_fusion=False,
    persist_layer_norm=False,
    apply_rope_fusion=False,
    bias_activation_fusion=False,
    hidden_dropout=0.0,
    attention_dropout=0.0,
)


def load_hf_config(hf_dir_or_config) -> Any:
    """A ``transformers`` config from a local directory, a config.json dict, or a config object."""
    if isinstance(hf_dir_or_config, (str, os.PathLike)):
        path = Path(hf_dir_or_config)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} is not a Hugging Face model directory (no config.json)")
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(str(path), local_files_only=True)
    if isinstance(hf_dir_or_config, Mapping):
        from transformers import AutoConfig

        d = dict(hf_dir_or_config)
        return AutoConfig.for_model(d.pop("model_type"), **d)
    return hf_dir_or_config


def arch_of_hf(hf) -> ArchSpec:
    names = list(getattr(hf, "architectures", None) or []) + [getattr(hf, "model_type", "")]
    for n in names:
        try:
            return get_arch(n)
        except ValueError:
            continue
    from verl_bridge.arch.moe import unsupported_hf_reason

    raise ValueError(unsupported_hf_reason(names) or f"no registered architecture for HF architectures={names}")


def _current_tp() -> tuple[int, int]:
    from verl_bridge.distributed.state import model_parallel_state

    ps = model_parallel_state()
    return (1, 0) if ps is None else (ps.tp_size, ps.tp_rank)


def _current_ep() -> tuple[int, int]:
    from verl_bridge.distributed.state import model_parallel_state

    ps = model_parallel_state()
    return (1, 0) if ps is None else (ps.ep_size, ps.ep_rank)


def local_expert_count(model, ep_size: int) -> Optional[int]:
    """Experts each EP rank holds (None for a dense model)."""
    n = getattr(getattr(model, "config", None), "num_moe_experts", None)
    if n is None:
        return None
    if n % ep_size:
        raise ValueError(f"num_moe_experts={n} does not divide over EP={ep_size}")
    return n // ep_size


def hf_to_mcore_config(
    hf_dir_or_config, *, tp_size: Optional[int] = None, make_vocab_size_divisible_by: int = 128
) -> tuple[dict, dict, str]:
    """(TransformerConfig kwargs, GPTModel kwargs, architecture name) for an HF model.

    GPTModel kwargs: ``vocab_size`` (padded to ``make_vocab_size_divisible_by * tp_size`` as
    Megatron-LM does), ``max_sequence_length``, ``position_embedding_type``, ``rotary_base``,
    ``share_embeddings_and_output_weights`` and ``transformer_layer_spec`` (portable SDPA spec).
    ``tp_size`` defaults to megatron's current TP size (1 without parallel state).
    TransformerConfig kwargs include :data:`PORTABLE_FLAGS`; override them freely on GPU.
    """
    from verl_bridge.models.spec import get_portable_gpt_layer_spec

    hf = load_hf_config(hf_dir_or_config)
    spec = arch_of_hf(hf)
    tf, gpt = spec.mcore_config(hf)
    tf = {**PORTABLE_FLAGS, **tf}
    if tp_size is None:
        tp_size = _current_tp()[0]
    gpt = dict(gpt)
    gpt["vocab_size"] = padded_vocab_size(hf.vocab_size, tp_size, make_vocab_size_divisible_by)
    gpt["transformer_layer_spec"] = get_portable_gpt_layer_spec(
        tf["normalization"], qk_layernorm=bool(tf.get("qk_layernorm", False)), num_experts=tf.get("num_moe_experts"))
    return tf, gpt, spec.name


def dims_from_hf(hf_dir_or_config, padded: Optional[int] = None) -> ModelDims:
    hf = load_hf_config(hf_dir_or_config)
    tf, gpt = arch_of_hf(hf).mcore_config(hf)
    return ModelDims(
        num_layers=tf["num_layers"],
        hidden_size=tf["hidden_size"],
        num_attention_heads=tf["num_attention_heads"],
        num_query_groups=tf["num_query_groups"],
        head_dim=tf["kv_channels"],
        ffn_hidden_size=tf["ffn_hidden_size"],
        gated_linear_unit=tf["gated_linear_unit"],
        vocab_size=hf.vocab_size,
        padded_vocab_size=padded if padded is not None else hf.vocab_size,
        tie_embeddings=gpt["share_embeddings_and_output_weights"],
        num_experts=tf.get("num_moe_experts"),
        moe_ffn_hidden_size=tf.get("moe_ffn_hidden_size"),
        shared_expert_ffn_hidden_size=tf.get("moe_shared_expert_intermediate_size"),
    )


def _index_files(index: Path) -> list[str]:
    """The shard files a ``model.safetensors.index.json`` names; ValueError naming the problem for an
    index that is not ``{"weight_map": {tensor: file}}`` or names a file outside its directory."""
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
    except (ValueError, UnicodeDecodeError, AttributeError) as exc:
        raise ValueError(f"{index} is not a safetensors index (JSON with a \"weight_map\" object): {exc}") from None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{index} has no \"weight_map\" object mapping tensor names to shard files "
                         "(as transformers' save_pretrained writes it)")
    files = sorted(set(weight_map.values()), key=str)
    for f in files:
        if not is_inside(f):
            raise ValueError(f"{index} names the shard file {f!r}, which is not a file name inside {index.parent}; "
                             "refused (it would read weights from outside the model directory)")
    return files


def raw_layer_count(config_path):
    """``num_hidden_layers`` as written in a config.json (None when absent or unreadable: checked later)."""
    try:
        raw = json.loads(Path(config_path).read_bytes().decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return raw.get("num_hidden_layers") if isinstance(raw, dict) else None


def check_layer_count(num_layers, names, config_path, *, exact: bool = True) -> None:
    """ValueError unless the weights hold exactly layers ``0 .. num_layers - 1`` (``*.layers.<i>.*``):
    checked before anything is built or converted, so a config.json with another count (or a hostile
    10**9) is a clear error instead of a model built for it. ``exact=False``: only more layers than the
    weights hold is an error (a model built from the first layers of a checkpoint stays possible)."""
    import re

    found = {int(m.group(1)) for n in names for m in [re.search(r"(?:^|\.)layers\.(\d+)\.", n)] if m}
    if not found or num_layers is None:
        return  # naming this check does not know, or no count written: the per-tensor checks apply
    ok = isinstance(num_layers, int) and not isinstance(num_layers, bool) and 1 <= num_layers <= len(found) \
        and all(i in found for i in range(num_layers)) and (not exact or num_layers == len(found))
    if not ok:
        have = f"layers 0..{max(found)}" if found == set(range(max(found) + 1)) else f"{len(found)} layer indices"
        raise ValueError(f"{config_path} says num_hidden_layers={num_layers!r}, the weights hold {have}; "
                         "use the config.json that was saved with these weights")


class SafetensorsDir(Mapping):
    """Read-only, lazy ``name -> tensor`` view of an HF safetensors directory (sharded or not)."""

    def __init__(self, hf_dir):
        from safetensors import safe_open

        self.dir = Path(hf_dir)
        index = self.dir / "model.safetensors.index.json"
        if index.is_file():
            files = _index_files(index)
        else:
            files = sorted(p.name for p in self.dir.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(
                f"no *.safetensors files in {self.dir}; convert .bin weights with "
                "`transformers` (save_pretrained(safe_serialization=True)) first"
            )
        self._handles = {f: safe_open(str(self.dir / f), framework="pt") for f in files}
        self._where = {k: f for f, h in self._handles.items() for k in h.keys()}

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._where:
            raise KeyError(name)
        return self._handles[self._where[name]].get_tensor(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


def save_safetensors_dir(tensors: Mapping[str, torch.Tensor], config: dict, out_dir) -> None:
    """Write ``model.safetensors`` + ``config.json`` (HF layout) into *out_dir*."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def load_hf_weights(model, hf_dir) -> None:
    """Copy this rank's TP/PP shard of the HF weights in *hf_dir* into a built ``GPTModel``.

    TP and EP rank/size come from megatron's parallel state (1/0 without it; EP rank r loads the
    experts ``r * E/ep ...``, see :func:`verl_bridge.arch.convert.expert_owner`); the PP stage is read off
    the model itself (its first layer's global ``layer_number`` and pre/post_process), so a
    model built for any stage loads the right layers. Raises on any shape mismatch or missing
    tensor rather than leaving a parameter at its random init.
    """
    hf = load_hf_config(hf_dir)
    spec = arch_of_hf(hf)
    tp_size, tp_rank = _current_tp()
    ep_size, ep_rank = _current_ep()
    n_local = local_expert_count(model, ep_size)
    padded = getattr(model, "vocab_size", None) or hf.vocab_size
    dims = dims_from_hf(hf, padded)
    layers = getattr(getattr(model, "decoder", None), "layers", None)
    offset = (layers[0].layer_number - 1) if layers is not None and len(layers) else 0
    reader = SafetensorsDir(hf_dir)
    tie = bool(getattr(model, "share_embeddings_and_output_weights", False))
    extras: dict = {}
    with torch.no_grad():
        for local, tensor in model.state_dict(keep_vars=True).items():
            if local.endswith("._extra_state") or tensor is None:
                continue
            name = to_global_name(local, offset, ep_rank=ep_rank, num_local_experts=n_local)
            if name == "output_layer.weight" and tie:
                name = "embedding.word_embeddings.weight"  # last-stage copy of the tied embeddings
            full = hf_to_mcore(name, reader, spec, dims, extras=extras)
            shard = shard_for_tp(name, full, tp_size, tp_rank, dims)
            if tuple(shard.shape) != tuple(tensor.shape):
                raise ValueError(
                    f"{local}: HF weights give shape {tuple(shard.shape)} for TP rank {tp_rank}/{tp_size}, "
                    f"model has {tuple(tensor.shape)}"
                )
            tensor.copy_(shard.to(tensor.dtype))


def build_gpt_model(tf_kwargs: dict, gpt_kwargs: dict, *, pre_process: bool = True, post_process: bool = True,
                    **overrides):
    """A megatron-core ``GPTModel`` from the two kwarg dicts, TP/PP sizes from parallel state."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    from verl_bridge.compat import make_cpu_safe
    from verl_bridge.distributed.state import model_parallel_state

    ps = model_parallel_state()
    tp, pp, ep = (1, 1, 1) if ps is None else (ps.tp_size, ps.pp_size, ps.ep_size)
    tf = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp, **tf_kwargs, **overrides}
    if tf.get("num_moe_experts") is not None:  # experts split over megatron's EP group
        tf.setdefault("expert_model_parallel_size", ep)
    if pp > 1 and tf.get("pipeline_dtype") is None:  # what pipeline schedules receive in (megatron requires it)
        tf["pipeline_dtype"] = tf.get("params_dtype", torch.float32)
    if tf.get("moe_shared_expert_gate") and "moe_shared_expert_gate" not in TransformerConfig.__dataclass_fields__:
        from verl_bridge.compat.mcore_versions import mcore_version

        raise ValueError(f"megatron-core {'.'.join(map(str, mcore_version()))} has no moe_shared_expert_gate "
                         "(checked: 0.16.1 and 0.19.2 have it, 0.13.1 not): a gated shared expert (Qwen2-MoE) "
                         "needs a newer megatron-core")
    config = TransformerConfig(**tf)
    gpt_kwargs = dict(gpt_kwargs)
    if "transformer_layer_spec" in gpt_kwargs:  # sequence parallel: an SP-capable final norm
        from verl_bridge.models.spec import block_spec_for_layer

        gpt_kwargs["transformer_layer_spec"] = block_spec_for_layer(config, gpt_kwargs["transformer_layer_spec"])
    model = GPTModel(config=config, pre_process=pre_process, post_process=post_process, **gpt_kwargs)
    return make_cpu_safe(model)


def hf_model_provider(hf_dir, *, load_weights: bool = True, **config_overrides) -> Callable:
    """``model_provider(pre_process=True, post_process=True)`` building a GPTModel for *hf_dir*.

    With ``load_weights`` (default) the model is initialised from the HF weights of this rank's
    TP/PP shard; ``config_overrides`` go to ``TransformerConfig`` (e.g. ``params_dtype``).
    """

    def model_provider(pre_process: bool = True, post_process: bool = True, **_ignored):
        if load_weights:  # before transformers reads config.json: 10**9 layers would allocate per-layer lists
            path = Path(hf_dir) / "config.json"
            check_layer_count(raw_layer_count(path), SafetensorsDir(hf_dir), path, exact=False)
        tf, gpt, _ = hf_to_mcore_config(hf_dir)
        model = build_gpt_model(tf, gpt, pre_process=pre_process, post_process=post_process, **config_overrides)
        # the unpadded vocabulary: rollout never samples megatron's padding rows, export drops them
        model.hf_vocab_size = load_hf_config(hf_dir).vocab_size
        if load_weights:
            load_hf_weights(model, hf_dir)
        return model

    return model_provider
