"""The fixture corpus: status, extracted values, provenance, warnings and the exact rewrite.

Each ``fixtures/<name>.py`` is a script written for these tests; ``fixtures/after/<name>.py`` and
``.yaml`` hold the expected rewrite and config for the ones that migrate.
"""

from __future__ import annotations

import os

import libcst as cst
import pytest
import yaml
from libcst.codemod import CodemodContext, CodemodTest

from verl_bridge.codemods.migrate_ppo_loop import MigratePPOLoopCommand
from verl_bridge.migrate.engine import migrate_source
from verl_bridge.migrate.yamlout import nest

HERE = os.path.dirname(__file__)
FIX = os.path.join(HERE, "fixtures")

# name -> (status, expected config subset, provenance lines, substrings of reasons, substrings of warnings)
EXPECT = {
    "megatron_lm_ppo": ("migrated", {
        "algorithm.name": "ppo", "algorithm.clip_ratio": 0.2, "algorithm.value_clip": 0.3,
        "algorithm.kl.coef": 0.02, "algorithm.kl.placement": "reward", "algorithm.kl.estimator": "k1",
        "algorithm.gamma": 0.99, "algorithm.lam": 0.95, "algorithm.vf_coef": 0.1, "algorithm.ppo_epochs": 4,
        "optim.actor.lr": 1e-6, "trainer.total_steps": 1000, "trainer.save_every": 50,
        "data.max_response_length": 128, "algorithm.micro_batch_size": 4,
        "model.actor.args.model_provider": "megatron_lm_ppo:model_provider"},
        {"algorithm.clip_ratio": 16, "optim.actor.lr": 64, "algorithm.kl.coef": 18},
        [], ["args.weight_decay", "reward", "initialize_megatron is imported"]),
    "mcore_ppo_names": ("migrated", {
        "algorithm.kl.coef": 0.1, "algorithm.clip_ratio": 0.2, "optim.actor.lr": 5e-6, "optim.critic.lr": 1e-5,
        "algorithm.gamma": 1.0, "algorithm.lam": 0.9, "algorithm.ppo_epochs": 2, "algorithm.mini_batch_size": 16,
        "algorithm.whiten_advantages": True, "trainer.args.tp_size": 2, "rollout.temperature": 0.7,
        "rollout.top_p": 0.9, "model.reward.args.path": "mcore_ppo_names:score"},
        {"algorithm.kl.coef": 5, "algorithm.clip_ratio": 7, "optim.actor.lr": 14}, [], []),
    "grpo_k3": ("migrated", {
        "algorithm.name": "grpo", "algorithm.group_size": 8, "algorithm.clip_ratio_low": 0.2,
        "algorithm.clip_ratio_high": 0.28, "algorithm.kl.estimator": "k3", "algorithm.kl.placement": "loss",
        "algorithm.kl.coef": 0.04, "algorithm.ppo_epochs": 2, "trainer.total_steps": 500,
        "optim.actor.weight_decay": 0.1, "model.reward.args.path": "grpo_k3:accuracy_reward"},
        {"algorithm.ppo_epochs": 4, "trainer.total_steps": 5, "algorithm.group_size": 3}, [], []),
    "trl_dict_config": ("migrated", {
        "algorithm.kl.coef": 0.2, "algorithm.kl.target": 6, "algorithm.kl.horizon": 10000,
        "algorithm.clip_ratio": 0.2, "algorithm.value_clip": 0.2, "algorithm.vf_coef": 0.1,
        "algorithm.ppo_epochs": 4, "algorithm.mini_batch_size": 16, "data.rollout_batch_size": 256,
        "optim.actor.lr": 1.41e-5, "model.actor.args.model_name_or_path": "/data/models/gpt2-imdb",
        "model.reward.args.path": "trl_dict_config:reward_fn"},
        {"algorithm.kl.coef": 8}, [], ["total_steps is left out"]),
    "trl_pipeline_reward": ("migrated", {
        "algorithm.kl.coef": 0.05, "algorithm.clip_ratio": 0.1, "trainer.total_steps": 100},
        {}, [], ["reward", "TODO"]),
    "deepspeed_chat": ("migrated", {
        "algorithm.kl.coef": 0.1, "algorithm.clip_ratio": 0.2, "algorithm.value_clip": 0.2,
        "algorithm.gamma": 1.0, "algorithm.lam": 0.95},
        {"algorithm.kl.coef": 17}, [], ["reward clipping", "ptx", "EMA", "max_length"]),
    "kl_controller": ("migrated", {
        "algorithm.kl.coef": 0.05, "algorithm.kl.target": 6.0, "algorithm.kl.horizon": 10000,
        "optim.actor.lr": 3e-6, "algorithm.gamma": 0.99, "algorithm.lam": 0.9},
        {}, [], []),
    "cleanrl_dataclass": ("migrated", {
        "algorithm.clip_ratio": 0.15, "algorithm.vf_coef": 0.25, "algorithm.entropy_coef": 0.01,
        "algorithm.ppo_epochs": 3, "trainer.total_steps": 300, "algorithm.gamma": 0.97, "algorithm.lam": 0.92,
        "algorithm.kl.coef": 0.03, "optim.actor.lr": 2.5e-5, "optim.actor.clip_grad": 0.5},
        {"algorithm.clip_ratio": 9, "trainer.total_steps": 22}, [], ["early stopping on KL", "learning-rate anneal"]),
    "runtime_values": ("migrated", {"algorithm.clip_ratio": 0.2, "trainer.total_steps": 300, "algorithm.group_size": 8},
        {}, [], ["optim.actor.lr is left out", "world size"]),
    "reward_closure": ("migrated", {"optim.actor.lr": 3e-6, "algorithm.kl.coef": 0.0},
        {"optim.actor.lr": 16}, [], ["LR = 1e-05 is defined", "reward_of", "no KL penalty"]),
    "crlf_cells": ("migrated", {"algorithm.group_size": 4, "model.reward.args.path": "crlf_cells:reward_fn"}, {}, [], []),
    "hook_style": ("refused", {}, {}, ["no training loop of its own", "ppo_train"], []),
    "sft_mentions_ppo": ("refused", {}, {}, ["not an RL training loop"], []),
    "kl_old_policy": ("refused", {}, {}, ["old policy"], []),
    "module_level_loop": ("refused", {}, {}, ["cannot tell how advantages", "model_provider"], []),
    "reinforce_no_clip": ("refused", {}, {}, ["no clipped probability ratio"], []),
    "already_migrated": ("unchanged", {}, {}, [], []),
    "merge_conflict": ("error", {}, {}, ["merge-conflict"], []),
}


def _read(name: str, sub: str = "") -> bytes:
    with open(os.path.join(FIX, sub, name), "rb") as fh:
        return fh.read()


def test_corpus_is_large_enough():
    files = [f for f in os.listdir(FIX) if f.endswith(".py")]
    assert len(files) >= 15
    assert set(EXPECT) == {f[:-3] for f in files}


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_fixture(name):
    status, config, lines, reasons, warnings = EXPECT[name]
    res = migrate_source(_read(f"{name}.py"), f"{name}.py", f"{name}.yaml")
    assert res.status == status, (res.reasons, res.warnings)
    for key, value in config.items():
        assert key in res.config, (key, res.config, res.warnings)
        assert res.config[key] == pytest.approx(value) if isinstance(value, float) else res.config[key] == value
        assert res.provenance[key].startswith(f"{name}.py:")
    for key, line in lines.items():
        assert res.provenance[key] == f"{name}.py:{line}"
    for r in reasons:
        assert any(r in x for x in res.reasons), res.reasons
    for w in warnings:
        assert any(w in x for x in res.warnings), res.warnings
    if status == "migrated":
        assert res.new_source == _read(f"{name}.py", "after")
        assert res.yaml_text == _read(f"{name}.yaml", "after").decode()
        assert yaml.safe_load(res.yaml_text) == nest(res.config)
        # idempotent: a second run reports unchanged
        again = migrate_source(res.new_source, f"{name}.py", f"{name}.yaml")
        assert again.status == "unchanged"
    else:
        assert res.new_source is None and not res.config


def test_crlf_and_comments_kept():
    res = migrate_source(_read("crlf_cells.py"), "crlf_cells.py", "crlf_cells.yaml")
    out = res.new_source
    assert b"\r\n" in out and b"\n" not in out.replace(b"\r\n", b"")
    for piece in ["# GRPO 训练脚本 — Скрипт обучения", "# %%", "@cached", "# модель", '"""Entraîner."""']:
        assert piece.encode() in out


def test_keyboard_interrupt_block_kept():
    res = migrate_source(_read("megatron_lm_ppo.py"), "megatron_lm_ppo.py", "megatron_lm_ppo.yaml")
    code = res.new_source.decode()
    assert "try:\n        MegatronTrainer(config).train()\n    except KeyboardInterrupt:" in code
    assert "# save_checkpoint(iteration, model, optimizer, opt_param_scheduler, 0)" in code


class TestCodemod(CodemodTest):
    TRANSFORM = MigratePPOLoopCommand

    def test_noop_on_migrated(self):
        src = _read("already_migrated.py").decode()
        self.assertCodemod(src, src, context_override=CodemodContext(filename="already_migrated.py"))

    def test_refusal_skips(self):
        src = _read("hook_style.py").decode()
        self.assertCodemod(src, src, expected_skip=True, context_override=CodemodContext(filename="hook_style.py"))

    def test_before_after(self):
        before = _read("grpo_k3.py").decode()
        after = _read("grpo_k3.py", "after").decode()
        self.assertCodemod(before, after, context_override=CodemodContext(filename="grpo_k3.py"))


def test_output_parses_for_every_migrated_fixture():
    for name, (status, *_rest) in EXPECT.items():
        if status == "migrated":
            cst.parse_module(_read(f"{name}.py", "after"))
