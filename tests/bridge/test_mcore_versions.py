"""The version shims report the installed megatron-core and switch at the versions they name."""


def test_version_and_range():
    import megatron.core

    from verl_bridge.compat import mcore_versions as mv

    major, minor = (int(x) for x in megatron.core.__version__.split(".")[:2])
    assert mv.mcore_version() == (major, minor)
    assert mv.SUPPORTED == ((0, 12), (0, 19)) and mv.check_supported() is None
    assert "0.12 to 0.19" in mv.__doc__


def test_shims_follow_the_version(monkeypatch):
    from verl_bridge.compat import mcore_versions as mv

    monkeypatch.setattr(mv, "mcore_version", lambda: (0, 12))
    assert mv.gpt_model_kwargs(vp_stage=1) == {} and mv.default_pg_collection() is None
    assert "outside" not in (mv.check_supported() or "")
    monkeypatch.setattr(mv, "mcore_version", lambda: (0, 13))
    assert mv.gpt_model_kwargs(vp_stage=1) == {"vp_stage": 1} and mv.gpt_model_kwargs(None) == {}
    monkeypatch.setattr(mv, "mcore_version", lambda: (0, 11))
    assert "outside verl-bridge's supported range 0.12-0.19" in mv.check_supported()


def test_gpt_model_class_is_megatrons():
    from megatron.core.models.gpt import GPTModel

    from verl_bridge.compat.mcore_versions import gpt_model_class

    assert gpt_model_class() is GPTModel


# the version each shim switches at: 0.12-0.16 from the installed wheels, 0.17/0.18 read from their
# wheels, 0.19 from the 0.19.2 wheel (.ci/mcore_019_tier.sh)
SHIM_VERSIONS = {
    "VP_STAGE_SINCE": (0, 13), "PG_COLLECTION_SINCE": (0, 15), "ROPE_GET_EMB_SINCE": (0, 16),
    "RESHARDING_SINCE": (0, 16), "RESHARD_EXECUTOR_CUDA_SYNC_SINCE": (0, 17), "RESHARD_TASK_ID_KWARG_SINCE": (0, 18),
    "GPTMODEL_DEPRECATED_SINCE": (0, 19), "DIST_CKPT_STRATEGY_BASE_REMOVED_IN": (0, 19),
    "DIST_CKPT_COMMON_IN_DISTCP_SINCE": (0, 19),
}


def test_each_shim_names_its_version_and_is_documented():
    from verl_bridge.compat import mcore_versions as mv

    for name, version in SHIM_VERSIONS.items():
        assert getattr(mv, name) == version, name
        assert name.replace("_SINCE", "").replace("_REMOVED_IN", "")[:14] in mv.__doc__.replace("``\n", ""), name


def test_which_versions_each_shim_serves(monkeypatch):
    """Per supported minor version: (vp_stage passed, resharding executor syncs CUDA, CopyService
    takes group=, common state goes to the strategy as a ShardedObject)."""
    from verl_bridge.compat import mcore_versions as mv

    seen = {}
    for minor in range(12, 20):
        monkeypatch.setattr(mv, "mcore_version", lambda minor=minor: (0, minor))
        seen[minor] = (mv.gpt_model_kwargs(vp_stage=0) == {"vp_stage": 0}, mv.reshard_needs_cuda_sync(),
                       "group" in mv.copy_service_init_kwargs(), mv.common_state_in_sharded_dict())
        assert mv.check_supported() is None
    assert seen == {12: (False, False, False, False), 13: (True, False, False, False), 14: (True, False, False, False),
                    15: (True, False, False, False), 16: (True, False, False, False), 17: (True, True, False, False),
                    18: (True, True, True, False), 19: (True, True, True, True)}


def test_torch_dist_writer_base_matches_the_installed_version():
    from verl_bridge.checkpoint.torch_dist import SyncTorchDistSaveStrategy
    from verl_bridge.compat import mcore_versions as mv

    base = mv.torch_dist_save_strategy_base()
    want = ("TorchDistSaveShardedStrategy" if mv.mcore_version() >= mv.DIST_CKPT_STRATEGY_BASE_REMOVED_IN
            else "SaveShardedStrategy")
    assert base.__name__ == want and issubclass(SyncTorchDistSaveStrategy, base)


def test_moe_router_shim_names_its_versions():
    """compat/moe.py: megatron's RouterGatingLinearFunction reads ``te_general_gemm``, which 0.13 to 0.16 bind
    only when Transformer Engine imports (NameError without it) and 0.19 binds to None otherwise."""
    from megatron.core.transformer.moe import moe_utils

    from verl_bridge.compat import moe
    from verl_bridge.compat.mcore_versions import mcore_version

    assert moe.ROUTER_TE_GEMM_UNBOUND == ((0, 13), (0, 18))
    lo, hi = moe.ROUTER_TE_GEMM_UNBOUND
    if moe_utils.HAVE_TE:
        return
    if lo <= mcore_version() <= hi:
        assert not hasattr(moe_utils, "te_general_gemm")  # the NameError the shim avoids
    else:
        assert moe_utils.te_general_gemm is None
    assert moe.router_needs_shim()  # no Transformer Engine here (and no CUDA on the CPU tiers)
