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


def test_algorithm_specs_name_registered_functions():
    from verl_bridge.algorithms import ALGORITHMS, POLICY_LOSSES

    assert list(ALGORITHMS) == ["ppo", "grpo", "rloo", "reinforce_plus_plus"]
    for spec in ALGORITHMS.values():
        assert spec.advantage in ADVANTAGE_ESTIMATORS and spec.policy_loss in POLICY_LOSSES
        assert spec.needs_critic == needs_critic(spec.advantage), spec.name


def test_validator_and_trainer_read_the_same_algorithm_spec():
    """A spec registered once is accepted by the validator, with its own group-size and KL rules."""
    from verl_bridge.algorithms import ALGORITHMS, AlgorithmSpec, register_algorithm
    from verl_bridge.config import ConfigError, load_config
    from verl_bridge.runtime.trainer import MegatronTrainer

    spec = register_algorithm(AlgorithmSpec("test_grpo3", advantage="grpo", min_group_size=3,
                                            kl_placements=("loss",)))
    try:
        base = ["model.actor.args.preset=tiny", "algorithm.name=test_grpo3", "algorithm.kl.placement=loss"]
        cfg = load_config(None, base + ["algorithm.group_size=3", "algorithm.mini_batch_size=96",
                                        "algorithm.micro_batch_size=32"])
        assert MegatronTrainer(cfg).spec is spec
        with pytest.raises(ConfigError) as err:
            load_config(None, base + ["algorithm.group_size=2", "algorithm.kl.placement=reward"])
        assert "algorithm.group_size=2: algorithm.name='test_grpo3' compares responses within a group and needs " \
               "group_size >= 3" in str(err.value)
        assert "algorithm.kl.placement='reward': unknown name; allowed: loss" in str(err.value)
    finally:
        ALGORITHMS.pop("test_grpo3")



def test_a_spec_that_needs_a_critic_gets_one_from_the_loader():
    """needs_critic is read where the config is completed: ppo (gae) gets the actor's model + a value head."""
    from verl_bridge.algorithms import ALGORITHMS, AlgorithmSpec, register_algorithm
    from verl_bridge.config import load_config

    base = ["model.actor.args.preset=tiny", "algorithm.group_size=2"]
    assert load_config(None, base + ["algorithm.name=ppo"]).model.critic.type == "megatron"
    assert load_config(None, base + ["algorithm.name=grpo"]).model.critic is None
    register_algorithm(AlgorithmSpec("test_gae", advantage="gae", needs_critic=True))
    try:
        assert load_config(None, base + ["algorithm.name=test_gae"]).model.critic is not None
    finally:
        ALGORITHMS.pop("test_gae")
