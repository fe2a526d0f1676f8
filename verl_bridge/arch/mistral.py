"""Mistral (``MistralForCausalLM``): the Llama weight layout.

``sliding_window`` is not applied by the portable SDPA attention: sequences longer than the
window attend to the whole prefix (identical results for sequences up to the window length).
"""

from __future__ import annotations

from verl_bridge.arch.llama import FROM_HF, llama_family_config, llama_family_hf_config
from verl_bridge.arch.spec import ArchSpec

MISTRAL = ArchSpec(
    name="mistral",
    hf_architectures=("MistralForCausalLM",),
    hf_model_type="mistral",
    from_hf=FROM_HF,
    # Llama and Mistral share weights; a megatron model is called Mistral only with base 1e6.
    features=dict(normalization="RMSNorm", gated_linear_unit=True, add_qkv_bias=False,
                  add_bias_linear=False, position_embedding_type="rope", rotary_base=1e6),
    mcore_config=lambda hf: llama_family_config(hf, add_qkv_bias=False),
    hf_config=lambda d: {**llama_family_hf_config(d, arch="MistralForCausalLM", model_type="mistral"),
                         "sliding_window": d.get("sliding_window")},
)
