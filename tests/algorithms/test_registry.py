"""Registering a new algorithm is one decorator; lookups of unknown names explain themselves."""

import pytest
import torch

from verl_bridge.algorithms import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    UnknownNameError,
    kl_penalty,
    needs_critic,
    register_advantage,
    register_kl,
)


@pytest.fixture
def scratch_names():
    added = []
    yield added
    for registry, name in added:
        registry.pop(name, None)


def test_register_custom_estimator_and_kl(scratch_names):
    @register_advantage("test_mc", needs_critic=True)
    def mc(token_rewards, mask, **_):
        ret = token_rewards.flip(-1).cumsum(-1).flip(-1) * mask
        return ret, ret

    @register_kl("test_abs")
    def kl_abs(log_prob, ref_log_prob):
        return (log_prob - ref_log_prob).abs()

    scratch_names += [(ADVANTAGE_ESTIMATORS, "test_mc"), (KL_ESTIMATORS, "test_abs")]
    assert needs_critic("test_mc")
    adv, _ = ADVANTAGE_ESTIMATORS["test_mc"](token_rewards=torch.tensor([[1.0, 2.0]]), mask=torch.ones(1, 2), gamma=1.0)
    assert adv.tolist() == [[3.0, 2.0]]
    assert kl_penalty(torch.tensor([0.0]), torch.tensor([0.5]), "test_abs").item() == 0.5
    ADVANTAGE_ESTIMATORS.pop("test_mc")
    assert not needs_critic("test_mc")


def test_duplicate_registration_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        register_advantage("gae")(lambda **_: None)


def test_unknown_name_is_value_and_key_error_with_plain_message():
    with pytest.raises(KeyError):
        KL_ESTIMATORS["k9"]
    try:
        KL_ESTIMATORS["k9"]
    except UnknownNameError as err:
        assert isinstance(err, ValueError)
        assert str(err) == "unknown KL estimator 'k9'; allowed: k1, k2, k3"
    assert KL_ESTIMATORS.get("k9") is None and "k9" not in KL_ESTIMATORS
