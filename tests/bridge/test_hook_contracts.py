"""Contract tests: every supported model_provider / load_checkpoint signature, and the refusals."""

import pytest

from verl_bridge.common.hooks import (
    ACCEPTED_PROVIDER_SIGNATURES,
    HookSignatureError,
    call_load_checkpoint,
    call_model_provider,
)


def test_pre_post_process():
    def model_provider(pre_process=True, post_process=True):
        return ("pp", pre_process, post_process)

    assert call_model_provider(model_provider, True, False) == ("pp", True, False)


def test_with_vp_stage():
    def model_provider(pre_process=True, post_process=True, vp_stage=None):
        return (pre_process, post_process, vp_stage)

    assert call_model_provider(model_provider, False, True, vp_stage=1) == (False, True, 1)


def test_config_first():
    def model_provider(config, pre_process=True, post_process=True, parallel_output=True):
        return (config, pre_process, post_process)

    assert call_model_provider(model_provider, True, True, config="CFG") == ("CFG", True, True)


def test_megatron_lm_root_provider_with_builder():
    def gpt_builder(args, pre_process, post_process, vp_stage=None, config=None, pg_collection=None):
        return ("built", pre_process, post_process, vp_stage, pg_collection)

    def model_provider(model_builder, pre_process=True, post_process=True, vp_stage=None, config=None,
                       pg_collection=None):
        return model_builder(None, pre_process, post_process, vp_stage, config, pg_collection)

    got = call_model_provider(model_provider, True, False, vp_stage=0, pg_collection="PG", model_builder=gpt_builder)
    assert got == ("built", True, False, 0, "PG")


def test_root_provider_without_builder_is_explained():
    def model_provider(model_builder, pre_process=True, post_process=True, vp_stage=None, config=None,
                       pg_collection=None):
        raise AssertionError("must not be called")

    with pytest.raises(HookSignatureError, match="takes a model_builder first"):
        call_model_provider(model_provider)


def test_no_arguments():
    assert call_model_provider(lambda: "m") == "m"


def test_unsupported_signature_shows_found_and_accepted():
    def model_provider(tokenizer, pre_process=True):
        raise AssertionError("must not be called")

    with pytest.raises(HookSignatureError) as e:
        call_model_provider(model_provider)
    msg = str(e.value)
    assert "model_provider(tokenizer, pre_process=True)" in msg
    for sig in ACCEPTED_PROVIDER_SIGNATURES:
        assert sig in msg


def test_loader_signatures():
    calls = []

    def megatron_lm(model, optimizer, opt_param_scheduler):
        calls.append(("mlm", model, optimizer, opt_param_scheduler))

    def by_path(model, path):
        calls.append(("path", model, path))

    def model_only(model):
        calls.append(("model", model))

    call_load_checkpoint(megatron_lm, ["m"], None, None)  # frozen roles: (model, None, None)
    call_load_checkpoint(by_path, ["m"], path="/ckpt")
    call_load_checkpoint(model_only, ["m"])
    assert calls == [("mlm", ["m"], None, None), ("path", ["m"], "/ckpt"), ("model", ["m"])]
    with pytest.raises(HookSignatureError, match="takes a path"):
        call_load_checkpoint(by_path, ["m"])
