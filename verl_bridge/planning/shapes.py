"""Model shapes for planning, without loading weights: a built-in table, an HF ``config.json``, or the tiny preset.

A :class:`ModelShape` holds what the memory and refit arithmetic needs (layers, widths, heads,
vocabulary, positions, which tensors carry biases, tied embeddings). ``parameter_tensors`` lists
the full (unsharded, HF-layout) tensors one weight sync streams, in order.
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

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def to_dict(self) -> dict:
        return asdict(self)


def _opt(name, layers, hidden, heads, ffn):
    return ModelShape(name, layers, hidden, heads, heads, ffn, 50272, 2048, tied_embeddings=True, linear_bias=True,
                      norm_bias=True, learned_positions=True)


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
}


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
                          linear_bias=bool(cfg.get("enable_bias", True)), norm_bias=True, learned_positions=True)
    act = str(cfg.get("hidden_act", "silu"))
    return ModelShape(
        name, layers, hidden, heads, int(get("num_key_value_heads", default=heads)),
        int(get("intermediate_size", "ffn_dim", default=4 * hidden)), int(get("vocab_size")),
        int(get("max_position_embeddings", default=4096)),
        gated_mlp=act in ("silu", "swiglu", "gelu_pytorch_tanh") and mt not in ("gpt_neox", "phi"),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        linear_bias=bool(cfg.get("mlp_bias", False)) and bool(cfg.get("attention_bias", False)),
        qkv_bias=mt.startswith("qwen2") or bool(cfg.get("attention_bias", False)),
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
        for cand in (full, path):
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


def parameter_tensors(shape: ModelShape) -> list[tuple[str, int]]:
    """(name, element count) of every full tensor in HF order: what one weight sync streams."""
    s = shape
    h, hd = s.hidden_size, s.head_dim
    qkv = (s.num_attention_heads + 2 * s.num_query_groups) * hd
    out: list[tuple[str, int]] = [("embed_tokens", s.vocab_size * h)]
    if s.learned_positions:
        out.append(("embed_positions", s.max_position_embeddings * h))
    norm = h * (2 if s.norm_bias else 1)
    up = s.ffn_hidden_size * (2 if s.gated_mlp else 1)
    for i in range(s.num_layers):
        out += [(f"layers.{i}.input_norm", norm), (f"layers.{i}.qkv", h * qkv)]
        if s.linear_bias or s.qkv_bias:
            out.append((f"layers.{i}.qkv_bias", qkv))
        out.append((f"layers.{i}.o_proj", s.num_attention_heads * hd * h))
        if s.linear_bias:
            out.append((f"layers.{i}.o_proj_bias", h))
        out += [(f"layers.{i}.post_attention_norm", norm), (f"layers.{i}.up", h * up)]
        if s.linear_bias:
            out.append((f"layers.{i}.up_bias", up))
        out.append((f"layers.{i}.down", s.ffn_hidden_size * h))
        if s.linear_bias:
            out.append((f"layers.{i}.down_bias", h))
    out.append(("final_norm", norm))
    if not s.tied_embeddings:
        out.append(("lm_head", s.vocab_size * h))
    return out
