"""Pure tensor conversion between HF names and megatron-core GPTModel names, and TP/PP sharding.

Pipeline for one tensor (no process groups anywhere here):
HF tensors --hf_to_mcore--> full (TP-merged, global layer index) megatron tensor
--shard_for_tp--> TP shard --(PP: global -> local layer index)--> rank state dict, and back with
merge_tp / mcore_to_hf.

``config`` in these functions is a :class:`ModelDims` (what conversion needs to know) or
anything :func:`dims_of` understands (a megatron ``TransformerConfig``, a dict). Vocabulary
padding: megatron pads the vocabulary (``word_embeddings`` and ``output_layer`` rows) to
``padded_vocab_size``; import pads with zero rows, export drops them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Mapping, MutableMapping, Optional

import torch

from verl_bridge.arch.fused import FUSED_PARTS, fuse_gate_up, fuse_qkv, split_gate_up, split_qkv_grouped
from verl_bridge.arch.registry import ArchSpec, get_arch

VOCAB_PARAMS = ("embedding.word_embeddings.weight", "output_layer.weight")
POSITION_PARAM = "embedding.position_embeddings.weight"


@dataclass(frozen=True)
class ModelDims:
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    ffn_hidden_size: int
    gated_linear_unit: bool
    vocab_size: Optional[int] = None  # the HF (unpadded) vocabulary
    padded_vocab_size: Optional[int] = None
    tie_embeddings: bool = False
    # Mixture-of-Experts (None: a dense MLP): routed experts, each expert's and the shared expert's hidden size
    num_experts: Optional[int] = None
    moe_ffn_hidden_size: Optional[int] = None
    shared_expert_ffn_hidden_size: Optional[int] = None


def padded_vocab_size(vocab_size: int, tp_size: int = 1, divisible_by: int = 128) -> int:
    """Megatron-LM's ``_vocab_size_with_padding``: round up to ``divisible_by * tp_size``."""
    multiple = divisible_by * tp_size
    return ((vocab_size + multiple - 1) // multiple) * multiple


def dims_of(config) -> ModelDims:
    if isinstance(config, ModelDims):
        return config
    if isinstance(config, Mapping):
        names = {f.name for f in fields(ModelDims)}
        return ModelDims(**{k: v for k, v in config.items() if k in names})
    heads = config.num_attention_heads
    return ModelDims(
        num_layers=config.num_layers,
        hidden_size=config.hidden_size,
        num_attention_heads=heads,
        num_query_groups=config.num_query_groups or heads,
        head_dim=config.kv_channels or config.hidden_size // heads,
        ffn_hidden_size=config.ffn_hidden_size,
        gated_linear_unit=bool(config.gated_linear_unit),
        vocab_size=getattr(config, "vocab_size", None),
        padded_vocab_size=getattr(config, "padded_vocab_size", None),
        tie_embeddings=bool(getattr(config, "share_embeddings_and_output_weights", False)),
        num_experts=getattr(config, "num_moe_experts", None),
        moe_ffn_hidden_size=getattr(config, "moe_ffn_hidden_size", None),
        shared_expert_ffn_hidden_size=getattr(config, "moe_shared_expert_intermediate_size", None),
    )


# ``{}`` is the layer index, ``{e}`` the (global) expert index of a Mixture-of-Experts layer
LAYER, EXPERT = "{}", "{e}"


def _template_regex(template: str) -> re.Pattern:
    rx = re.escape(template).replace(re.escape(LAYER), r"(?P<layer>\d+)").replace(re.escape(EXPERT), r"(?P<expert>\d+)")
    return re.compile("^" + rx + "$")


_TABLES: dict[int, tuple] = {}


def _tables(spec: ArchSpec):
    """(mcore template -> [(part or None, hf template)], compiled regexes for both sides)."""
    cached = _TABLES.get(id(spec))
    if cached is not None and cached[0] is spec:
        return cached[1]
    to_hf: dict[str, list] = {}
    for hf_t, target in spec.from_hf.items():
        if target is None:
            continue
        mc_t, part = (target, None) if isinstance(target, str) else target
        to_hf.setdefault(mc_t, []).append((part, hf_t))
    for mc_t, parts in to_hf.items():
        leaf = mc_t.split(".")[-2]
        if len(parts) > 1 or parts[0][0] is not None:
            order = FUSED_PARTS.get(leaf)
            if order is None or sorted(p for p, _ in parts) != sorted(order):
                raise ValueError(f"architecture {spec.name}: bad fused entry for {mc_t}: {parts}")
            parts.sort(key=lambda ph: order.index(ph[0]))
    mc_rx = [(_template_regex(t), t) for t in to_hf]
    hf_rx = [(_template_regex(t), t) for t in spec.from_hf]
    _TABLES[id(spec)] = (spec, (to_hf, mc_rx, hf_rx))
    return to_hf, mc_rx, hf_rx


def _match(rx_list, name: str):
    for rx, template in rx_list:
        m = rx.match(name)
        if m:
            return template, m.groupdict()
    return None, None


def _fill(template: str, index: Optional[dict]) -> str:
    """``template`` with its ``{}`` (layer) and ``{e}`` (expert) placeholders filled from ``index``."""
    if not index:
        return template
    if index.get("expert") is not None:
        template = template.replace(EXPERT, index["expert"])
    return template.replace(LAYER, index["layer"]) if index.get("layer") is not None else template


_RESOLVED: dict = {}


def _resolve(spec, name: str):
    """(template, parts, hf_names) of megatron tensor *name*; ValueError when the spec lacks it.

    Memoised per (spec, name): the weight-sync stream resolves the same ~300 names every sync.
    """
    key = (id(spec), name)
    hit = _RESOLVED.get(key)
    if hit is not None and hit[0] is spec:
        return hit[1]
    out = _resolve_uncached(spec, name)
    _RESOLVED[key] = (spec, out)
    return out


def _resolve_uncached(spec, name: str):
    to_hf, mc_rx, _ = _tables(spec)
    template, index = _match(mc_rx, name)
    if template is None:
        raise ValueError(f"unknown parameter {name}")
    parts = to_hf[template]
    return template, parts, [_fill(hf_t, index) for _, hf_t in parts]


def hf_sources(name: str, arch_spec, config=None) -> list[str]:
    """HF tensor names needed to build megatron tensor *name* (global layer index)."""
    return _resolve(get_arch(arch_spec), name)[2]


def _pad_rows(t: torch.Tensor, rows: Optional[int]) -> torch.Tensor:
    if rows is None or t.shape[0] == rows:
        return t
    if t.shape[0] > rows:
        raise ValueError(f"vocabulary of {t.shape[0]} rows does not fit padded size {rows}")
    pad = torch.zeros((rows - t.shape[0],) + tuple(t.shape[1:]), dtype=t.dtype)
    return torch.cat([t, pad], dim=0)


def hf_to_mcore(
    name: str,
    hf_tensors: Mapping[str, torch.Tensor],
    arch_spec,
    config,
    *,
    extras: Optional[MutableMapping[str, torch.Tensor]] = None,
) -> torch.Tensor:
    """Full megatron tensor *name* from the HF tensors it is made of (see :func:`hf_sources`).

    *extras*, when given, receives HF data that has no place in megatron (OPT's 2 leading
    position rows) so that an export can reproduce the HF file bit for bit.
    """
    spec = get_arch(arch_spec)
    dims = dims_of(config)
    template, parts, srcs = _resolve(spec, name)
    missing = [s for s in srcs if s not in hf_tensors]
    if missing:
        raise KeyError(f"HF tensors {missing} needed for {name} are missing")
    tensors = [hf_tensors[s] for s in srcs]
    leaf = template.split(".")[-2]
    if len(parts) == 1 and parts[0][0] is None:
        out = tensors[0]
    elif leaf == "linear_qkv":
        out = fuse_qkv(*tensors, dims.num_attention_heads, dims.num_query_groups)
    elif leaf == "linear_fc1":
        out = fuse_gate_up(*tensors)
    else:  # pragma: no cover - _tables validates fused entries
        raise ValueError(f"unknown parameter {name}")
    if name in VOCAB_PARAMS:
        out = _pad_rows(out, dims.padded_vocab_size)
    if name == POSITION_PARAM and spec.position_offset:
        if extras is not None:
            extras[srcs[0]] = out[: spec.position_offset].clone()
        out = out[spec.position_offset :]
    return out.contiguous()


def mcore_to_hf_parts(
    name: str,
    tensor: torch.Tensor,
    arch_spec,
    config,
    *,
    extras: Optional[Mapping[str, torch.Tensor]] = None,
) -> list[tuple[str, torch.Tensor, tuple[int, ...]]]:
    """:func:`mcore_to_hf` without the copies: ``(hf_name, part, hf_shape)`` per HF tensor.

    ``part`` is a view of ``tensor`` wherever the conversion is only slicing (vocabulary padding
    dropped, gate/up halves, the q/k/v rows of each query group); ``part.reshape(hf_shape)`` is the
    HF tensor. Only a learned-position table with a leading offset (OPT) gives a new tensor.
    """
    spec = get_arch(arch_spec)
    dims = dims_of(config)
    if name.endswith("._extra_state"):
        return []
    if name == "output_layer.weight" and dims.tie_embeddings:
        return []
    template, parts, hf_names = _resolve(spec, name)
    if name in VOCAB_PARAMS and dims.vocab_size is not None:
        tensor = tensor[: dims.vocab_size]
    if name == POSITION_PARAM and spec.position_offset:
        lead = (extras or {}).get(hf_names[0])
        if lead is None:
            lead = torch.zeros((spec.position_offset,) + tuple(tensor.shape[1:]), dtype=tensor.dtype)
        tensor = torch.cat([lead.to(device=tensor.device, dtype=tensor.dtype), tensor], dim=0)
    leaf = template.split(".")[-2]
    if len(parts) == 1 and parts[0][0] is None:
        return [(hf_names[0], tensor, tuple(tensor.shape))]
    if leaf == "linear_qkv":
        rest = tuple(tensor.shape[1:])
        return [(n, t, (t.shape[0] * t.shape[1],) + rest)
                for n, t in zip(hf_names, split_qkv_grouped(tensor, dims.num_attention_heads, dims.num_query_groups))]
    return [(n, t, tuple(t.shape)) for n, t in zip(hf_names, split_gate_up(tensor))]


def mcore_to_hf(
    name: str,
    tensor: torch.Tensor,
    arch_spec,
    config,
    *,
    extras: Optional[Mapping[str, torch.Tensor]] = None,
) -> list[tuple[str, torch.Tensor]]:
    """HF-named tensors from one FULL (TP-merged, global layer index) megatron tensor.

    ``_extra_state`` entries give ``[]``; so does ``output_layer.weight`` of a tied model (HF
    ties ``lm_head`` to the embeddings). Anything the spec does not know raises
    ``ValueError(f"unknown parameter {name}")``.
    """
    return [(n, t.reshape(shape).contiguous())
            for n, t, shape in mcore_to_hf_parts(name, tensor, arch_spec, config, extras=extras)]


def mcore_names(arch_spec, config) -> list[str]:
    """Every megatron parameter name (global layer index) of the full model, in a fixed order."""
    spec = get_arch(arch_spec)
    dims = dims_of(config)
    to_hf, _, _ = _tables(spec)
    names = []
    for template in to_hf:
        if template == "output_layer.weight" and dims.tie_embeddings:
            continue
        if EXPERT in template:
            if not dims.num_experts:
                raise ValueError(f"architecture {spec.name} has experts ({template}) but the config has no "
                                 "num_experts (num_moe_experts)")
            names += [template.replace(LAYER, str(i)).replace(EXPERT, str(e))
                      for i in range(dims.num_layers) for e in range(dims.num_experts)]
        elif LAYER in template:
            names += [template.replace(LAYER, str(i)) for i in range(dims.num_layers)]
        else:
            names.append(template)
    return names


# ---- tensor parallelism -------------------------------------------------------------------

_COLUMN = ("linear_qkv.weight", "linear_qkv.bias", "linear_fc1.weight", "linear_fc1.bias",
           "embedding.word_embeddings.weight", "output_layer.weight")
_ROW = ("linear_proj.weight", "linear_fc2.weight")


def tp_split_dim(name: str) -> Optional[int]:
    """0 for column-parallel tensors, 1 for row-parallel weights, None for replicated ones."""
    if name.endswith(_COLUMN):
        return 0
    if name.endswith(_ROW):
        return 1
    return None


def is_gated_fc1(name: str, config) -> bool:
    """Whether ``name`` is a gated MLP's fc1 (stored as ``[gate; up]``, split per half over TP)."""
    if not name.endswith(("linear_fc1.weight", "linear_fc1.bias")):
        return False
    if config is None:
        return False
    if hasattr(config, "gated_linear_unit"):
        return bool(config.gated_linear_unit)
    return bool(dims_of(config).gated_linear_unit)


def shard_for_tp(name: str, full_tensor: torch.Tensor, tp_size: int, tp_rank: int, config=None) -> torch.Tensor:
    """This TP rank's shard of a full megatron tensor (gated fc1: ``[gate_i; up_i]``)."""
    if tp_size == 1:
        return full_tensor
    dim = tp_split_dim(name)
    if dim is None:
        return full_tensor
    if full_tensor.shape[dim] % tp_size:
        raise ValueError(f"{name}: dimension {dim} of size {full_tensor.shape[dim]} does not divide by TP={tp_size}")
    if is_gated_fc1(name, config):
        gate, up = split_gate_up(full_tensor)
        return torch.cat([gate.chunk(tp_size, 0)[tp_rank], up.chunk(tp_size, 0)[tp_rank]], 0).contiguous()
    return full_tensor.chunk(tp_size, dim)[tp_rank].contiguous()


def merge_tp(name: str, shards: list[torch.Tensor], config=None) -> torch.Tensor:
    """Inverse of :func:`shard_for_tp`; replicated tensors return the first shard."""
    if len(shards) == 1:
        return shards[0]
    dim = tp_split_dim(name)
    if dim is None:
        return shards[0]
    if is_gated_fc1(name, config):
        halves = [split_gate_up(s) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], 0).contiguous()
    return torch.cat(shards, dim).contiguous()


# ---- pipeline parallelism -----------------------------------------------------------------

_LAYER_RX = re.compile(r"^decoder\.layers\.(\d+)\.(.*)$")


def pp_layer_range(num_layers: int, pp_size: int, pp_rank: int) -> range:
    """Layers of stage *pp_rank* with an even split (megatron's default layout)."""
    if num_layers % pp_size:
        raise ValueError(f"num_layers={num_layers} does not divide by PP={pp_size}")
    per = num_layers // pp_size
    return range(pp_rank * per, (pp_rank + 1) * per)


def stage_names(full_names: list[str], num_layers: int, pp_size: int, pp_rank: int, tie: bool) -> dict[str, str]:
    """Global name -> local name of the tensors stage *pp_rank* holds.

    First stage: embeddings. Last stage: final norm and output layer; with tied embeddings and
    PP > 1 the last stage holds a copy of the word embeddings as ``output_layer.weight``
    (key ``"output_layer.weight"`` maps from the global embedding name then).
    """
    layers = pp_layer_range(num_layers, pp_size, pp_rank)
    first, last = pp_rank == 0, pp_rank == pp_size - 1
    out: dict[str, str] = {}
    for g in full_names:
        m = _LAYER_RX.match(g)
        if m:
            i = int(m.group(1))
            if i in layers:
                out[g] = f"decoder.layers.{i - layers.start}.{m.group(2)}"
        elif g.startswith("embedding."):
            if first:
                out[g] = g
        elif last:
            out[g] = g
    return out


def to_global_name(local: str, layer_offset: int, *, ep_rank: int = 0, num_local_experts: Optional[int] = None) -> str:
    """Global name of a rank's parameter: layer ``i`` -> ``layer_offset + i``; with expert
    parallelism (``num_local_experts`` given) local expert ``j`` of EP rank ``ep_rank`` ->
    ``ep_rank * num_local_experts + j``."""
    m = _LAYER_RX.match(local)
    if not m:
        return local
    rest = m.group(2)
    if num_local_experts is not None:
        rest = expert_global_name(rest, ep_rank, num_local_experts)
    return f"decoder.layers.{int(m.group(1)) + layer_offset}.{rest}"


# ---- expert parallelism -------------------------------------------------------------------
# megatron's SequentialMLP holds experts as ``mlp.experts.local_experts.{j}``; with EP=ep and E
# experts, EP rank r holds the E/ep experts ``r * E/ep + j`` (j < E/ep): expert e lives on EP rank
# ``e // (E/ep)`` at local index ``e % (E/ep)`` (megatron's MoELayer ``local_expert_indices``).

_EXPERT_RX = re.compile(r"^(.*\.local_experts\.)(\d+)(\..*)$")


def expert_index(name: str) -> Optional[int]:
    """The expert index in a ``...local_experts.{j}...`` name (None for a non-expert parameter)."""
    m = _EXPERT_RX.match(name)
    return int(m.group(2)) if m else None


def expert_owner(expert: int, num_experts: int, ep_size: int) -> tuple[int, int]:
    """(EP rank, local index) of global expert ``expert``."""
    if num_experts % ep_size:
        raise ValueError(f"num_experts={num_experts} does not divide over EP={ep_size}")
    per = num_experts // ep_size
    if not 0 <= expert < num_experts:
        raise ValueError(f"expert {expert} is out of range for num_experts={num_experts}")
    return expert // per, expert % per


def expert_global_name(name: str, ep_rank: int, num_local_experts: int) -> str:
    """``...local_experts.{j}...`` of EP rank ``ep_rank`` -> the global expert index."""
    m = _EXPERT_RX.match(name)
    if not m:
        return name
    return f"{m.group(1)}{ep_rank * num_local_experts + int(m.group(2))}{m.group(3)}"


def expert_local_name(name: str, num_experts: int, ep_size: int) -> tuple[Optional[int], str]:
    """(owning EP rank, name with the local expert index) of a global name; (None, name) for a
    parameter every EP rank holds."""
    m = _EXPERT_RX.match(name)
    if not m:
        return None, name
    rank, local = expert_owner(int(m.group(2)), num_experts, ep_size)
    return rank, f"{m.group(1)}{local}{m.group(3)}"
