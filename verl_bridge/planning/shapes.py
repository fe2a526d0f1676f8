"""Model shapes for planning, without loading weights: a built-in table, an HF ``config.json``, or the tiny preset.

A :class:`ModelShape` holds what the memory and refit arithmetic needs (layers, widths, heads,
vocabulary, positions, which tensors carry biases, tied embeddings). :func:`stream_entries` lists
the full tensors one weight sync streams, in the order of :class:`verl_bridge.resharding.WeightExporter`.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Optional


@dataclass(frozen=True)
class ModelShape:
    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int  # key/value heads (GQA); = num_attention_heads for plain MHA
    ffn_hidden_size: int
    vocab_size: int
    max_position_embeddings: int
    gated_mlp: bool = False  # SwiGLU: gate + up + down matrices
    tied_embeddings: bool = False
    linear_bias: bool = False  # biases on every linear layer (OPT, GPT-2)
    qkv_bias: bool = False  # bias on QKV only (Qwen2)
    norm_bias: bool = False  # LayerNorm (weight + bias) rather than RMSNorm (weight)
    learned_positions: bool = False  # absolute position table (OPT, GPT-2) rather than RoPE
    vocab_divisible_by: int = 128  # Megatron pads the vocabulary to a multiple of this * TP (tiny preset: 1)
    position_offset: int = 0  # extra rows of the HF position table (OPT: 2)
    # Mixture-of-Experts (num_experts 0: dense): every layer's MLP is E routed SwiGLU experts of
    # moe_ffn_hidden_size (plus a shared expert, with a sigmoid gate where shared_expert_gate)
    num_experts: int = 0
    moe_ffn_hidden_size: int = 0
    moe_topk: int = 0
    shared_expert_ffn_hidden_size: int = 0
    shared_expert_gate: bool = False
    qk_norm: bool = False  # per-head RMSNorm on queries and keys (Qwen3)
    kv_channels: int = 0  # head dimension when it is not hidden / heads (Qwen3); 0: hidden / heads

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def to_dict(self) -> dict:
        return asdict(self)


def _opt(name, layers, hidden, heads, ffn):
    return ModelShape(name, layers, hidden, heads, heads, ffn, 50272, 2048, tied_embeddings=True, linear_bias=True,
                      norm_bias=True, learned_positions=True, position_offset=2)


# Shapes as published in each model's Hugging Face config.json.
BUILTIN_SHAPES: dict[str, ModelShape] = {
    "opt-125m": _opt("opt-125m", 12, 768, 12, 3072),
    "opt-350m": _opt("opt-350m", 24, 1024, 16, 4096),
    "opt-1.3b": _opt("opt-1.3b", 24, 2048, 32, 8192),
    "opt-2.7b": _opt("opt-2.7b", 32, 2560, 32, 10240),
    "opt-6.7b": _opt("opt-6.7b", 32, 4096, 32, 16384),
    "llama-2-7b": ModelShape("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, 4096, gated_mlp=True),
    "llama-3-8b": ModelShape("llama-3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, gated_mlp=True),
    "qwen2.5-0.5b": ModelShape("qwen2.5-0.5b", 24, 896, 14, 2, 4864, 151936, 32768, gated_mlp=True,
                               tied_embeddings=True, qkv_bias=True),
    "qwen2.5-7b": ModelShape("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, 32768, gated_mlp=True, qkv_bias=True),
    # Mixture-of-Experts: 46,702,792,704 parameters (Mixtral-8x7B), 30,532,122,624 (Qwen3-30B-A3B),
    # 14,315,784,192 (Qwen1.5-MoE-A2.7B)
    "mixtral-8x7b": ModelShape("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 32768, gated_mlp=True, num_experts=8,
                               moe_ffn_hidden_size=14336, moe_topk=2),
    "qwen3-30b-a3b": ModelShape("qwen3-30b-a3b", 48, 2048, 32, 4, 6144, 151936, 40960, gated_mlp=True,
                                num_experts=128, moe_ffn_hidden_size=768, moe_topk=8, qk_norm=True, kv_channels=128),
    "qwen1.5-moe-a2.7b": ModelShape("qwen1.5-moe-a2.7b", 24, 2048, 16, 16, 5632, 151936, 8192, gated_mlp=True,
                                    qkv_bias=True, num_experts=60, moe_ffn_hidden_size=1408, moe_topk=4,
                                    shared_expert_ffn_hidden_size=5632, shared_expert_gate=True),
}

# MoE model types whose layers the shapes here cannot describe (see verl_bridge.arch.moe)
_UNSUPPORTED_MOE_TYPES = ("deepseek_v2", "deepseek_v3", "glm4_moe", "gpt_oss", "qwen3_next", "llama4")


class ShapeError(ValueError):
    pass


def shape_from_hf_config(cfg: dict, name: str = "hf") -> ModelShape:
    """Read an HF ``config.json`` dict (OPT, GPT-2, Llama/Mistral/Qwen2-style keys)."""
    mt = cfg.get("model_type", "")

    def get(*keys, default=None):
        for k in keys:
            if cfg.get(k) is not None:
                return cfg[k]
        if default is None:
            raise ShapeError(f"{name}: config.json has none of {', '.join(keys)}")
        return default

    hidden = int(get("hidden_size", "n_embd", "d_model"))
    heads = int(get("num_attention_heads", "n_head"))
    layers = int(get("num_hidden_layers", "n_layer"))
    if mt == "opt" or mt == "gpt2":
        ffn = int(get("ffn_dim", "n_inner", default=4 * hidden) or 4 * hidden)
        return ModelShape(name, layers, hidden, heads, heads, ffn, int(get("vocab_size")),
                          int(get("max_position_embeddings", "n_positions")),
                          tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
                          linear_bias=bool(cfg.get("enable_bias", True)), norm_bias=True, learned_positions=True,
                          position_offset=2 if mt == "opt" else 0)
    act = str(cfg.get("hidden_act", "silu"))
    if mt in _UNSUPPORTED_MOE_TYPES:
        raise ShapeError(f"{name}: model_type {mt!r} (MLA / grouped routing / dense first layers) is not a layout the "
                         "planner describes; the MoE shapes cover Mixtral, Qwen2-MoE and Qwen3-MoE")
    experts = int(cfg.get("num_local_experts") or cfg.get("num_experts") or 0)
    moe = {}
    if experts:
        moe = dict(num_experts=experts, moe_topk=int(get("num_experts_per_tok")),
                   moe_ffn_hidden_size=int(get("moe_intermediate_size", "intermediate_size")),
                   shared_expert_ffn_hidden_size=int(cfg.get("shared_expert_intermediate_size") or 0),
                   shared_expert_gate=bool(cfg.get("shared_expert_intermediate_size")),
                   qk_norm=mt == "qwen3_moe")
    head_dim = cfg.get("head_dim")
    kv_channels = int(head_dim) if head_dim and int(head_dim) != hidden // heads else 0
    return ModelShape(
        name, layers, hidden, heads, int(get("num_key_value_heads", default=heads)),
        int(get("intermediate_size", "ffn_dim", default=4 * hidden)), int(get("vocab_size")),
        int(get("max_position_embeddings", default=4096)),
        gated_mlp=act in ("silu", "swiglu", "gelu_pytorch_tanh") and mt not in ("gpt_neox", "phi"),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        linear_bias=bool(cfg.get("mlp_bias", False)) and bool(cfg.get("attention_bias", False)),
        qkv_bias=mt.startswith("qwen2") or bool(cfg.get("attention_bias", False)),
        kv_channels=kv_channels, **moe,
    )


def resolve_shape(config, model_shape: Optional[str] = None) -> tuple[ModelShape, str]:
    """The actor's shape and where it came from: ``model_shape`` (a built-in name or a config.json
    path) > the tiny preset's args > ``model_name_or_path``'s config.json > a built-in shape named
    like that path's last component (``models/opt-1.3b``). Raises :class:`ShapeError` otherwise."""
    if model_shape:
        key = model_shape.lower()
        if key in BUILTIN_SHAPES:
            return BUILTIN_SHAPES[key], f"--model-shape {key} (built-in table)"
        path = model_shape if model_shape.endswith(".json") else os.path.join(model_shape, "config.json")
        if os.path.isfile(path):
            return _read(path), f"--model-shape {path}"
        raise ShapeError(f"--model-shape {model_shape!r}: not a built-in shape ({', '.join(BUILTIN_SHAPES)}) "
                         "nor a config.json / directory holding one")
    a = config.model.actor.args
    if a.preset == "tiny":
        d = config.data
        return ModelShape("tiny", a.num_layers, a.hidden_size, a.num_attention_heads,
                          a.num_query_groups or a.num_attention_heads, a.ffn_hidden_size or 4 * a.hidden_size, 16,
                          d.max_prompt_length + d.max_response_length + 8, gated_mlp=True,
                          vocab_divisible_by=1), \
            "model.actor.args (tiny preset)"
    path = a.model_name_or_path
    if path:
        full = path if os.path.isabs(path) else os.path.join(config.source_dir or os.getcwd(), path)
        from verl_bridge.data.hub import cached, is_hub_id

        snapshot = cached(path, a.revision) if is_hub_id(path) and not os.path.isdir(full) else None
        for cand in (full, path) + ((snapshot,) if snapshot else ()):  # a hub id: its cached snapshot
            if os.path.isfile(os.path.join(cand, "config.json")):
                return _read(os.path.join(cand, "config.json")), f"{os.path.join(cand, 'config.json')}"
        key = os.path.basename(os.path.normpath(path)).lower()
        if key in BUILTIN_SHAPES:
            return BUILTIN_SHAPES[key], (f"built-in table for '{key}' ({path} has no config.json here; "
                                         "the plan needs no weights)")
        raise ShapeError(f"model.actor.args.model_name_or_path={path!r}: no config.json found; give the shape "
                         f"with --model-shape NAME ({', '.join(BUILTIN_SHAPES)}) or a config.json path")
    raise ShapeError("the actor comes from a model_provider, whose shape cannot be read without building it; "
                     f"give --model-shape NAME ({', '.join(BUILTIN_SHAPES)}) or a config.json path")


def _read(path: str) -> ModelShape:
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise ShapeError(f"{path}: cannot read ({exc})") from None
    name = os.path.basename(os.path.dirname(os.path.abspath(path))) or "hf"
    return shape_from_hf_config(cfg, name)


def padded_vocab(vocab: int, tp: int, divisible_by: int = 128) -> int:
    """Megatron-LM's rule: pad the vocabulary to a multiple of ``make_vocab_size_divisible_by * tp``."""
    m = divisible_by * tp
    return -(-vocab // m) * m


def stream_entries(shape: ModelShape, tp: int = 1) -> list[tuple[str, int, list[int]]]:
    """One weight sync's stream: ``(megatron tensor, full megatron elements, [HF piece elements])``.

    Order as :class:`verl_bridge.resharding.WeightExporter` streams it (``mcore_names``: tensor
    kind by kind, each over all layers). The megatron size includes the vocabulary padding for
    ``tp`` (what the exporter gathers); the pieces are the HF tensors it yields (q/k/v, gate/up
    split, padding dropped, OPT's two extra position rows added).
    """
    s = shape
    h, hd, L = s.hidden_size, s.head_dim, s.num_layers
    q, kv = s.num_attention_heads * hd, s.num_query_groups * hd
    vp = padded_vocab(s.vocab_size, tp, s.vocab_divisible_by)
    ffn = s.ffn_hidden_size
    out: list[tuple[str, int, list[int]]] = [("embedding", vp * h, [s.vocab_size * h])]
    if s.learned_positions:
        out.append(("position_embeddings", s.max_position_embeddings * h,
                    [(s.max_position_embeddings + s.position_offset) * h]))
    layer: list[tuple[str, int, list[int]]] = [("input_norm.weight", h, [h])]
    if s.norm_bias:
        layer.append(("input_norm.bias", h, [h]))
    layer.append(("linear_qkv.weight", (q + 2 * kv) * h, [q * h, kv * h, kv * h]))
    qkv_bias = [("linear_qkv.bias", q + 2 * kv, [q, kv, kv])] if (s.linear_bias or s.qkv_bias) else []
    if s.linear_bias:
        layer += qkv_bias
    layer.append(("linear_proj.weight", q * h, [q * h]))
    if s.linear_bias:
        layer.append(("linear_proj.bias", h, [h]))
    layer.append(("pre_mlp_norm.weight", h, [h]))
    if s.norm_bias:
        layer.append(("pre_mlp_norm.bias", h, [h]))
    if s.qk_norm:
        layer += [("q_layernorm.weight", hd, [hd]), ("k_layernorm.weight", hd, [hd])]
    if s.is_moe:  # router, then each expert's gated fc1 and fc2 (all experts: the exporter gathers them over EP)
        f = s.moe_ffn_hidden_size
        layer.append(("router.weight", s.num_experts * h, [s.num_experts * h]))
        layer += [("experts.{e}.linear_fc1.weight", 2 * f * h, [f * h, f * h]),
                  ("experts.{e}.linear_fc2.weight", f * h, [f * h])]
        if s.shared_expert_ffn_hidden_size:
            sf = s.shared_expert_ffn_hidden_size
            layer += [("shared_experts.linear_fc1.weight", 2 * sf * h, [sf * h, sf * h]),
                      ("shared_experts.linear_fc2.weight", sf * h, [sf * h])]
            if s.shared_expert_gate:
                layer.append(("shared_experts.gate_weight", h, [h]))
    else:
        fc1 = [ffn * h, ffn * h] if s.gated_mlp else [ffn * h]
        layer.append(("linear_fc1.weight", sum(fc1), fc1))
        if s.linear_bias:
            layer.append(("linear_fc1.bias", ffn * len(fc1), [ffn] * len(fc1)))
        layer.append(("linear_fc2.weight", ffn * h, [ffn * h]))
        if s.linear_bias:
            layer.append(("linear_fc2.bias", h, [h]))
    for name, full, pieces in layer:
        if "{e}" in name:  # one tensor per expert of every layer
            out += [(f"layers.{i}.{name.replace('{e}', str(e))}", full, pieces)
                    for i in range(L) for e in range(s.num_experts)]
        else:
            out += [(f"layers.{i}.{name}", full, pieces) for i in range(L)]
    out.append(("final_norm.weight", h, [h]))
    if s.norm_bias:
        out.append(("final_norm.bias", h, [h]))
    if not s.tied_embeddings:
        out.append(("output_layer", vp * h, [s.vocab_size * h]))
    if qkv_bias and not s.linear_bias:  # Qwen2's map lists the QKV biases last
        out += [(f"layers.{i}.linear_qkv.bias", full, pieces) for _, full, pieces in qkv_bias for i in range(L)]
    return out
