"""Config contract: the seed YAML loads as written, overrides, and every problem is listed at once."""

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from verl_bridge.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = sorted((REPO / "templates").glob("*.yaml"))

SEED_YAML = """\
trainer: {{type: megatron, args: {{tp_size: 2, pp_size: 2, dp_size: 1, sequence_parallel: true}}}}
model:
  actor:  {{type: megatron, args: {{model_name_or_path: {actor}, use_flash_attn: true}}}}
  critic: {{type: huggingface, args: {{model_name_or_path: {critic}}}}}
data: {{rollout_batch_size: 32, num_rollout_workers: 2}}
"""


@pytest.fixture
def seed_yaml(tmp_path):
    (tmp_path / "opt-actor").mkdir()
    (tmp_path / "opt-critic").mkdir()
    path = tmp_path / "seed.yaml"
    path.write_text(SEED_YAML.format(actor=tmp_path / "opt-actor", critic=tmp_path / "opt-critic"))
    return path


def test_seed_article_yaml_loads_as_written(seed_yaml):
    cfg = load_config(seed_yaml, world_size=4)
    assert cfg.trainer.type == "megatron"
    assert (cfg.trainer.args.tp_size, cfg.trainer.args.pp_size, cfg.trainer.args.dp_size) == (2, 2, 1)
    assert cfg.trainer.args.sequence_parallel is True
    assert cfg.model.actor.args.use_flash_attn is True
    assert cfg.model.critic.type == "huggingface"
    assert cfg.data.rollout_batch_size == 32 and cfg.data.num_rollout_workers == 2


def test_seed_yaml_rejects_wrong_world_size(seed_yaml):
    with pytest.raises(ConfigError) as e:
        load_config(seed_yaml, world_size=6)
    assert "does not divide world size 6" in str(e.value)


def test_overrides_are_typed_and_nested():
    cfg = load_config(TEMPLATES[0], ["trainer.total_steps=7", "optim.actor.lr=5e-4", "algorithm.kl.estimator=k3",
                                     "trainer.args.tp_size=2", "trainer.args.sequence_parallel=true"], world_size=2)
    assert cfg.trainer.total_steps == 7
    assert cfg.optim.actor.lr == pytest.approx(5e-4)
    assert cfg.algorithm.kl.estimator == "k3"
    assert cfg.trainer.args.sequence_parallel is True


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as e:
        load_config(REPO / "templates" / "quickstart.yaml", [
            "trainer.totl_steps=3",            # unknown key with a suggestion
            "trainer.args.tp_size=2",          # does not divide world 3
            "algorithm.name=dpo",              # unknown algorithm
            "rollout.engine=sglang",           # unknown engine
            "optim.actor.lr=-1",               # out of range
            "algorithm.micro_batch_size=abc",  # wrong type
            "model.reward.args.path=no_such_module_xyz:fn",  # missing module
        ], world_size=3)
    msg = str(e.value)
    assert len(e.value.problems) >= 7, msg
    for needle in ["trainer.totl_steps: unknown key (did you mean 'trainer.total_steps'?)",
                   "trainer.args.tp_size=2 does not divide world size 3",
                   "algorithm.name='dpo': unknown name; allowed: ppo, grpo, rloo, reinforce_plus_plus",
                   "rollout.engine='sglang'", "optim.actor.lr=-1.0: out of range",
                   "algorithm.micro_batch_size='abc': expected an integer",
                   "module 'no_such_module_xyz' not found"]:
        assert needle in msg, f"{needle!r} missing from:\n{msg}"


def test_batch_arithmetic_is_checked():
    with pytest.raises(ConfigError) as e:
        load_config(REPO / "templates" / "grpo.yaml", ["algorithm.mini_batch_size=48"])
    assert "algorithm.mini_batch_size=48 does not divide the 128 samples per step" in str(e.value)


def test_missing_model_directory_is_named(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(REPO / "templates" / "quickstart.yaml",
                    ["model.actor.args.preset=null", f"model.actor.args.model_name_or_path={tmp_path}/nope"])
    assert f"model.actor.args.model_name_or_path='{tmp_path}/nope': directory not found" in str(e.value)


def test_yaml_syntax_error_names_the_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  total_steps: 3\n  args: {tp_size: 2\n  seed: 1\n")
    with pytest.raises(ConfigError) as e:
        load_config(bad)
    assert "YAML syntax error at line 4" in str(e.value)


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: p.name)
def test_every_template_loads_validates_and_documents_itself(template, tmp_path):
    text = template.read_text()
    head = text.splitlines()[:12]
    assert head[0].startswith("#"), f"{template.name} must open with a comment"
    assert any("Tested on" in l or "Needs" in l for l in head), f"{template.name}: say what hardware it ran on"
    assert any("verl-bridge train" in l for l in head), f"{template.name}: give the launch command"
    overrides = []
    world = 1
    if "megatron_ppo" in template.name:  # the seed layout: point it at local directories, 4 ranks
        (tmp_path / "m").mkdir()
        (tmp_path / "prompts.jsonl").write_text('{"prompt": "hi", "answer": "1"}\n')
        overrides = [f"model.actor.args.model_name_or_path={tmp_path / 'm'}",
                     f"model.critic.args.model_name_or_path={tmp_path / 'm'}",
                     f"data.train_files={tmp_path / 'prompts.jsonl'}"]
        world = 4
    if "moe" in template.name:  # expert parallelism EP=2: two ranks
        world = 2
    if "vllm" in template.name and importlib.util.find_spec("vllm") is None:
        # rollout.engine: vllm without vLLM here: that is the one problem (the vLLM tier runs it)
        with pytest.raises(ConfigError) as e:
            load_config(template, overrides, world_size=world)
        assert "(1 problem)" in str(e.value) and "rollout.engine='vllm': vLLM is not installed" in str(e.value)
        load_config(template, overrides, world_size=world, check_paths=False)
        return
    load_config(template, overrides, world_size=world)


def _cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "verl_bridge.cli", *args], capture_output=True, text=True,
                          cwd=REPO, **kw)


def test_cli_dry_run_seed_yaml_prints_layout(seed_yaml):
    r = _cli("train", str(seed_yaml), "--dry-run", "--nproc-per-node", "4")
    assert r.returncode == 0, r.stderr
    assert "TP=2 PP=2 DP=1 SP=True" in r.stdout
    assert "critic: huggingface" in r.stdout


def test_cli_invalid_config_exits_2_and_names_the_key():
    r = _cli("train", "templates/quickstart.yaml", "--dry-run", "algorithm.kl.estimator=k9")
    assert r.returncode == 2
    assert "algorithm.kl.estimator='k9'" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_cli_pp_on_cpu_is_planned_not_refused():
    import torch

    if torch.cuda.is_available():
        pytest.skip("the CPU plan note")
    r = _cli("train", "templates/quickstart.yaml", "--nproc-per-node", "2", "trainer.args.pp_size=2", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "needs CUDA" not in r.stdout + r.stderr
    assert "pipeline schedules over gloo" in r.stdout and "2 generation replicas" in r.stdout


def test_ppo_without_a_critic_gets_the_actors_model_with_a_value_head():
    cfg = load_config(REPO / "templates" / "grpo.yaml", ["algorithm.name=ppo", "algorithm.group_size=1",
                                                         "data.rollout_batch_size=64"])
    assert cfg.model.critic is not None and cfg.model.critic.type == "megatron"
    assert load_config(REPO / "templates" / "grpo.yaml").model.critic is None  # GRPO stays critic-free


def test_verify_threshold_defaults_by_precision_and_must_be_positive():
    import torch

    from verl_bridge.rollout.verify import resolve_threshold

    cfg = load_config(REPO / "templates" / "quickstart.yaml")
    assert cfg.rollout.verify_threshold is None
    assert load_config(REPO / "templates" / "quickstart.yaml",
                       ["rollout.verify_threshold=0.05"]).rollout.verify_threshold == 0.05
    with pytest.raises(ConfigError) as e:
        load_config(REPO / "templates" / "quickstart.yaml", ["rollout.verify_threshold=0"])
    assert "rollout.verify_threshold=0" in str(e.value) and "out of range" in str(e.value)
    # unset: tight for fp32 weights, loose enough for bf16 (two correct kernel paths differ ~0.02)
    assert resolve_threshold(None, torch.nn.Linear(2, 2)) == 1e-3
    assert resolve_threshold(None, [torch.nn.Linear(2, 2).to(torch.bfloat16)]) == 0.1
    assert resolve_threshold(0.5, torch.nn.Linear(2, 2)) == 0.5


def test_sequence_parallel_at_tp1_is_refused_naming_both_keys():
    """SP splits the sequence over the TP group: at TP=1 there is none (Megatron-LM silently switches it
    off); the config says so before anything starts instead of reporting SP=True for a run without it."""
    with pytest.raises(ConfigError) as e:
        load_config(TEMPLATES[0], ["trainer.args.sequence_parallel=true"])
    msg = str(e.value)
    assert "trainer.args.sequence_parallel=true needs trainer.args.tp_size >= 2" in msg
    assert "trainer.args.sequence_parallel=false" in msg
    cfg = load_config(TEMPLATES[0], ["trainer.args.sequence_parallel=true", "trainer.args.tp_size=2"], world_size=2)
    assert cfg.trainer.args.sequence_parallel is True
