"""Architecture detection on models built by providers (not only configs), and a custom model with
a registered declarative map, including the error that names an uncovered parameter."""

import dataclasses
import sys
from pathlib import Path

from tests.dist_utils import run_distributed

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_model_provider"
FLAGS = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--vocab-size", "16", "--make-vocab-size-divisible-by", "16"]


def _custom_spec(with_norm_biases: bool):
    """A Llama-like model with LayerNorm (weight + bias) and a GELU MLP: not a built-in architecture."""
    from verl_bridge.arch import ArchSpec
    from verl_bridge.arch.llama import FROM_HF, L, M

    from_hf = {k: v for k, v in FROM_HF.items() if "gate_proj" not in k and "up_proj" not in k}
    from_hf[L + "mlp.fc_in.weight"] = M + "mlp.linear_fc1.weight"
    if with_norm_biases:
        from_hf.update({L + "input_layernorm.bias": M + "input_layernorm.bias",
                        L + "post_attention_layernorm.bias": M + "pre_mlp_layernorm.bias",
                        "model.norm.bias": "decoder.final_layernorm.bias"})
    return ArchSpec(name="my_gpt", hf_architectures=("MyGPTForCausalLM",), hf_model_type="my_gpt", from_hf=from_hf,
                    features={"normalization": "LayerNorm", "gated_linear_unit": False,
                              "position_embedding_type": "rope", "add_bias_linear": False})


def _detect_all(rank, world_size, hf_root):
    from verl_bridge.arch import detect_architecture, hf_model_provider, register_architecture
    from verl_bridge.bridge.architecture import resolve_architecture
    from verl_bridge.common.hooks import call_model_provider
    from verl_bridge.config import load_config
    from verl_bridge.models.tiny import tiny_model_provider
    from verl_bridge.distributed import init_model_parallel

    init_model_parallel(1, 1)
    out = {}
    # built-in architectures, each built by verl-bridge's HF-directory provider
    for arch in ("llama", "qwen2", "mistral", "opt"):
        model = call_model_provider(hf_model_provider(f"{hf_root}/{arch}", load_weights=False))
        out[arch] = (detect_architecture(model), resolve_architecture(model))
    # the quickstart's tiny preset provider and a Megatron-LM-style user provider (get_args globals)
    cfg = load_config("templates/quickstart.yaml", ["trainer.output_dir=null"])
    out["tiny_preset"] = resolve_architecture(call_model_provider(tiny_model_provider(cfg.model.actor.args, 16, 32)))
    sys.path.insert(0, str(EXAMPLE))
    import train_megatron as script

    script._GLOBAL_ARGS = script.parse_args(argv=FLAGS + ["--swiglu", "--untie-embeddings-and-output-weights"])
    a = script._GLOBAL_ARGS
    a.max_position_embeddings, a.ffn_hidden_size, a.num_query_groups = 16, 64, 4
    a.padded_vocab_size, a.params_dtype = 16, __import__("torch").float32
    out["user_provider"] = resolve_architecture(call_model_provider(script.model_provider))

    # a custom model: LayerNorm + GELU + RoPE. Unregistered: detection names its features
    a.normalization, a.swiglu = "LayerNorm", False
    custom = call_model_provider(script.model_provider)
    try:
        detect_architecture(custom)
    except ValueError as e:
        out["unregistered"] = str(e)
    # registered with a map that forgets the LayerNorm biases: the error names the parameter
    register_architecture("my_gpt", _custom_spec(with_norm_biases=False))
    out["detected_custom"] = detect_architecture(custom)
    try:
        resolve_architecture(custom)
    except ValueError as e:
        out["uncovered"] = str(e)
    # the complete map: detection and coverage agree
    register_architecture("my_gpt", _custom_spec(with_norm_biases=True))
    out["custom"] = resolve_architecture(custom)
    # a map entry the model lacks is a disagreement too
    spec = _custom_spec(with_norm_biases=True)
    register_architecture("my_gpt", dataclasses.replace(spec, from_hf={
        **spec.from_hf, "model.layers.{}.self_attn.q_norm.weight": "decoder.layers.{}.self_attention.q_layernorm.weight"}))
    try:
        resolve_architecture(custom)
    except ValueError as e:
        out["extra_entry"] = str(e)
    # built-ins are unaffected by the custom registration
    out["llama_after"] = detect_architecture(call_model_provider(hf_model_provider(f"{hf_root}/llama",
                                                                                   load_weights=False)))
    return out


def test_detection_on_providers_and_a_registered_custom_map(tmp_path):
    from tests.arch.tiny_hf import ARCHS, make_tiny_hf

    for arch in ARCHS:
        make_tiny_hf(arch, tmp_path / arch)
    out = run_distributed(_detect_all, 1, str(tmp_path))[0]
    for arch in ("llama", "qwen2", "mistral", "opt"):
        assert out[arch] == (arch, arch), (arch, out[arch])
    assert out["tiny_preset"] == "llama" and out["user_provider"] == "llama"
    assert "no registered architecture matches" in out["unregistered"] and "normalization=LayerNorm" in out["unregistered"]
    assert out["detected_custom"] == "my_gpt"
    assert out["uncovered"].startswith("parameter decoder.layers.0.input_layernorm.bias is not covered by the name "
                                       "map of architecture 'my_gpt'"), out["uncovered"]
    assert "decoder.final_layernorm.bias" in out["uncovered"] or "more" in out["uncovered"]
    assert out["custom"] == "my_gpt"
    assert "decoder.layers.0.self_attention.q_layernorm.weight" in out["extra_entry"]
    assert "does not have" in out["extra_entry"]
    assert out["llama_after"] == "llama"
