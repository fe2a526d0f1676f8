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
