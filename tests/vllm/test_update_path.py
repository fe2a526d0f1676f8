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


def test_require_vllm_errors_name_the_allowed_engines(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "vllm" else real(n, *a))
    with pytest.raises(ve.VllmUnavailableError, match="not installed") as e:
        ve.require_vllm(cuda_available=True)
    assert "rollout.engine: native" in str(e.value) and "native, vllm" in str(e.value)
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: object() if n == "vllm" else real(n, *a))
    with pytest.raises(ve.VllmUnavailableError, match="vLLM generation needs a GPU; use rollout.engine: native"):
        ve.require_vllm(cuda_available=False)
    ve.require_vllm(cuda_available=True)  # both present: no error


def test_hf_dir_for_actor_requires_a_config_json(tmp_path):
    from types import SimpleNamespace as NS

    cfg = NS(model=NS(actor=NS(args=NS(model_name_or_path=str(tmp_path)))))
    with pytest.raises(ve.VllmUnavailableError, match="model_name_or_path"):
        ve.hf_dir_for_actor(cfg)
    (tmp_path / "config.json").write_text("{}")
    assert ve.hf_dir_for_actor(cfg) == str(tmp_path)


def test_trainer_entry_point_refuses_clearly_here():
    """``build_vllm_engine`` (what MegatronTrainer.setup calls) on a machine without vLLM or CUDA."""
    from types import SimpleNamespace as NS

    import torch

    if torch.cuda.is_available():
        pytest.skip("this check is about machines without a GPU")
    cfg = NS(model=NS(actor=NS(args=NS(model_name_or_path=None))))
    with pytest.raises(ve.VllmUnavailableError, match=r"rollout\.engine: native|rollout\.engine='vllm' needs vLLM"):
        ve.build_vllm_engine(cfg, actor=None, layout=NS(tp_size=1))
