"""``ArchSpec``: one architecture's HF <-> megatron-core name map and config translation (data).

The per-architecture modules (``llama``, ``qwen2``, ``mistral``, ``opt``) build one each;
:mod:`verl_bridge.arch.registry` registers them and finds them by name or by detection.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Union

HFTarget = Union[str, tuple[str, str], None]


@dataclass(frozen=True, eq=False)
class ArchSpec:
    name: str
    hf_architectures: tuple[str, ...]
    hf_model_type: str
    from_hf: Mapping[str, HFTarget]
    # what detect_architecture compares: normalization, gated_linear_unit, add_qkv_bias,
    # add_bias_linear, position_embedding_type, and optionally rotary_base.
    features: Mapping[str, Any] = field(default_factory=dict)
    # rows at the start of the HF learned position table that megatron does not have (OPT: 2)
    position_offset: int = 0
    # hf PretrainedConfig -> (TransformerConfig kwargs, GPTModel kwargs); see hf_config.py
    mcore_config: Optional[Callable[[Any], tuple[dict, dict]]] = None
    # description dict (see hf_config.describe) -> HF config.json dict
    hf_config: Optional[Callable[[dict], dict]] = None
