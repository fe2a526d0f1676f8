"""The CPU half of tests/gpu/megatron_lm_flow.py, and Megatron-LM's precision rules in the bridge.

A Megatron-LM-style GPT with LayerNorm and learned absolute positions, built in bf16: raw from the
provider it is mixed-dtype (params_dtype makes the linear weights bf16, LayerNorm and the position
``Embedding`` stay fp32), which Megatron-LM never runs: ``get_model()`` wraps it in
``Float16Module``. Here: the fast decoder refuses the raw model with the reason; a real
``Float16Module``-wrapped one generates through the native engine's fast path; the bridge casts a
provider's model the same way; and the GPU script's GRPO path runs on CPU with the CPU-capable spec
(megatron.training and the local spec's attention are what only the GPU run has).
"""

import math
import sys
import types
from pathlib import Path

import pytest
import torch

from tests.dist_utils import run_distributed

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "gpu"))
import megatron_lm_flow as flow  # noqa: E402

ARGS = types.SimpleNamespace(padded_vocab_size=16, max_position_embeddings=32, position_embedding_type="learned_absolute",
                             untie_embeddings_and_output_weights=True, fp16_lm_cross_entropy=False)


def cpu_provider(pre_process=True, post_process=True):
    """The GPU script's GPT (LayerNorm, learned positions, bf16, linear biases) with the CPU-capable spec."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    from verl_bridge.compat import make_cpu_safe
    from verl_bridge.models.spec import get_portable_gpt_layer_spec
    from verl_bridge.models.tiny import transformer_config_kwargs

    config = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, normalization="LayerNorm",
                               init_method_std=0.02, **transformer_config_kwargs("bf16"))
    return make_cpu_safe(flow.gpt_model(config, ARGS, get_portable_gpt_layer_spec("LayerNorm"), pre_process,
                                        post_process))


def _refuse_and_wrap(rank, world_size):
    from megatron.core.transformer.module import Float16Module

    from verl_bridge.distributed import init_model_parallel, seed_everything
    from verl_bridge.rollout.base import SamplingParams
    from verl_bridge.rollout.fast_decode import FastDecoder, unsupported_reason
    from verl_bridge.rollout.native import NativeEngine

    init_model_parallel(1, 1)
    seed_everything(0)
    out = {}
    raw = cpu_provider()
    out["raw_dtypes"] = {n: str(p.dtype) for n, p in raw.named_parameters()
                         if n in ("embedding.position_embeddings.weight", "decoder.layers.0.input_layernorm.weight",
                                  "decoder.layers.0.self_attention.linear_qkv.weight")}
    out["reason"] = unsupported_reason(raw)
    try:
        FastDecoder(raw)
        out["decoder_error"] = None
    except ValueError as exc:
        out["decoder_error"] = str(exc)
    try:
        NativeEngine(raw, torch.device("cpu"), decode="fast")
        out["fast_error"] = None
    except ValueError as exc:
        out["fast_error"] = str(exc)
    auto = NativeEngine(raw, torch.device("cpu"), decode="auto")
    out["auto_path"] = auto.path  # (megatron's own module forward cannot run it either: the bridge casts)
    sp = SamplingParams(max_new_tokens=5, temperature=1.0, eos_token_id=None, pad_token_id=0)
    prompts = [[1, 5, 6, 7], [1, 9], [2, 3, 3, 4, 5, 6]]

    wrapped = Float16Module(raw.config, cpu_provider())  # what Megatron-LM's get_model() returns for --bf16
    out["wrapped_dtypes"] = sorted({str(p.dtype) for p in wrapped.parameters()})
    out["wrapped_reason"] = unsupported_reason(wrapped)
    fast = NativeEngine(wrapped, torch.device("cpu"), decode="fast")
    module = NativeEngine(wrapped, torch.device("cpu"), decode="module")
    batch = fast.generate(prompts, sp, seed=0)
    out["fast_path"], out["module_path"] = fast.path, module.path
    out["fast_tokens"] = batch.response_ids.tolist()
    out["fast_mask"] = batch.response_mask.tolist()
    ids = torch.tensor([[1, 5, 6, 7, 8, 9, 3, 2]])
    out["probe_diff"] = float((fast.probe_log_probs(ids, 16) - module.probe_log_probs(ids, 16)).abs().max())
    return out


def _model_checks(rank, world_size):
    return {"refuse": _refuse_and_wrap(rank, world_size), "gelu": _gelu_fusion_logits(rank, world_size)}


@pytest.fixture(scope="module")
def model_checks():
    """Both model-level checks in one gloo worker (one process start, one megatron import)."""
    return run_distributed(_model_checks, 1)[0]


def test_mixed_dtype_model_is_refused_and_float16module_generates_fast(model_checks):
    r = model_checks["refuse"]
    # the provider's raw model is mixed, as megatron builds it
    assert r["raw_dtypes"] == {"embedding.position_embeddings.weight": "torch.float32",
                               "decoder.layers.0.input_layernorm.weight": "torch.float32",
                               "decoder.layers.0.self_attention.linear_qkv.weight": "torch.bfloat16"}
    assert r["reason"].startswith("mixed parameter dtypes: most are bfloat16, but float32:")
    assert "embedding.position_embeddings.weight" in r["reason"] and "rollout.decode: module" in r["reason"]
    assert r["decoder_error"] == f"FastDecoder cannot run this model: {r['reason']}"
    assert r["fast_error"].startswith("rollout.decode=fast, but the fast decoder cannot run this model: mixed")
    assert r["auto_path"] == "module"  # auto never picks the fast path for it
    # Float16Module-wrapped (Megatron-LM's get_model()): one dtype, the fast decoder runs it
    assert r["wrapped_dtypes"] == ["torch.bfloat16"] and r["wrapped_reason"] is None
    assert (r["fast_path"], r["module_path"]) == ("fast", "module")
    assert all(0 <= t < 16 for row in r["fast_tokens"] for t in row) and all(m == 1 for row in r["fast_mask"] for m in row)
    assert r["probe_diff"] < 0.1  # the sync check's bf16 threshold: both paths compute the same model


def test_rollout_decode_is_validated():
    from verl_bridge.config import ConfigError, load_config

    assert load_config("templates/grpo.yaml", ["rollout.decode=module"]).rollout.decode == "module"
    with pytest.raises(ConfigError, match=r"rollout.decode='graph': unknown name; allowed: auto, fast, module"):
        load_config("templates/grpo.yaml", ["rollout.decode=graph"])


def _grpo_from_checkpoint(rank, world_size, root):
    from megatron.core.transformer.module import Float16Module

    from verl_bridge.bridge import MegatronBridge
    from verl_bridge.checkpoint.megatron import save
    from verl_bridge.distributed import init_model_parallel, seed_everything

    init_model_parallel(1, 1)
    seed_everything(3)
    pretrained = Float16Module(cpu_provider().config, cpu_provider())  # get_model()'s bf16 model
    save(f"{root}/ckpt", 10, {"model": pretrained.module, "optimizer": None, "opt_param_scheduler": None, "args": None})
    reference = flow.tensor_state(pretrained)
    seen = {}

    def load_checkpoint(model, path):  # verl-bridge's reader of the legacy layout, recording what it loaded
        from verl_bridge.checkpoint import load_model_weights

        load_model_weights(model[0] if isinstance(model, list) else model, path)
        if not seen:
            seen.update(flow.compare_weights(model[0] if isinstance(model, list) else model, reference))

    from megatron.core import parallel_state as mpu

    mpu.destroy_model_parallel()
    bridge = MegatronBridge(cpu_provider, load_checkpoint=load_checkpoint)
    overrides = flow.grpo_overrides(str(root), "cpu", 3, device="cpu") + [
        f"model.actor.args.load_path={root}/ckpt", "rollout.decode=fast", "data.rollout_batch_size=8",
        "algorithm.group_size=4", "algorithm.mini_batch_size=32", "algorithm.micro_batch_size=16"]
    steps, trainer = flow.run_grpo(bridge, str(flow.TEMPLATE), overrides)
    actor = trainer.roles.actor
    return {"steps": steps, "loaded": seen, "preset": trainer.config.model.actor.args.preset,
            "decode": trainer.engine.path, "actor_dtypes": sorted({str(p.dtype) for p in actor.parameters()})}


def test_gpu_script_grpo_path_on_cpu(tmp_path, capfd):
    """The GPU script's bridge path: template with preset: tiny, a bf16 LayerNorm/learned-position GPT
    cast like Float16Module, exact weights from a checkpoint, 3 GRPO steps through the fast decoder."""
    r = run_distributed(_grpo_from_checkpoint, 1, tmp_path)[0]
    assert r["preset"] is None
    assert "[INFO] model.actor.args.preset=tiny cleared: the model comes from the bridge's model_provider" in capfd.readouterr().out
    assert r["loaded"]["exact"] and r["loaded"]["tensors"] > 10 and r["loaded"]["dtypes"] == ["bfloat16"]
    assert r["actor_dtypes"] == ["torch.bfloat16"] and r["decode"] == "fast"
    assert [s["step"] for s in r["steps"]] == [1, 2, 3]
    assert all(math.isfinite(s["reward_mean"]) and math.isfinite(s["actor_loss"]) for s in r["steps"])


def _gelu_fusion_logits(rank, world_size):
    from megatron.core.transformer.transformer_config import TransformerConfig

    from verl_bridge.compat import make_cpu_safe
    from verl_bridge.models.spec import get_portable_gpt_layer_spec
    from verl_bridge.models.tiny import transformer_config_kwargs
    from verl_bridge.distributed import init_model_parallel, seed_everything
    from verl_bridge.rollout.fast_decode import FastDecoder
    from verl_bridge.common.batch import model_inputs

    init_model_parallel(1, 1)
    seed_everything(0)
    kw = transformer_config_kwargs("fp32")
    kw["bias_activation_fusion"] = True  # Megatron-LM's default (--bias-gelu-fusion): tanh-approximate GeLU
    config = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, normalization="LayerNorm",
                               init_method_std=0.5, **kw)
    model = make_cpu_safe(flow.gpt_model(config, ARGS, get_portable_gpt_layer_spec("LayerNorm"))).eval()
    seq = torch.randint(1, 16, (2, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(seq)
    with torch.no_grad():
        ids, pos, m = model_inputs(seq, mask)
        ref = model(ids, pos, m).float()
        dec = FastDecoder(model)
        got = dec.teacher_forced_logits(seq, 3)
        dec.act = torch.nn.functional.gelu  # what config.activation_func alone would say (erf GeLU)
        erf = dec.teacher_forced_logits(seq, 3)
    return float((got - ref).abs().max() / ref.abs().max()), float((erf - ref).abs().max() / ref.abs().max())


def test_fast_decoder_follows_megatrons_fused_bias_gelu(model_checks):
    """With bias_activation_fusion, megatron's MLP computes tanh-approximate GeLU; the decoder must too."""
    tanh_rel, erf_rel = model_checks["gelu"]
    assert tanh_rel < 1e-5 and erf_rel > 20 * tanh_rel, (tanh_rel, erf_rel)
