"""The README's bridge example, executed as written (the code block is read from README.md).

``my_project/pretrain_gpt.py`` is a tiny Megatron-LM-style script (its own ``initialize_megatron``,
a ``model_provider`` reading its own args, a ``load_checkpoint`` that reads nothing without
``--load``, as Megatron-LM's does) and ``ppo.yaml`` is a template copied into the working directory:
once as shipped (``preset: tiny`` for actor and critic, which the bridge clears), once with no
model source at all.
"""

import json
import os
import re
import sys
from pathlib import Path

import pytest

from tests.dist_utils import run_distributed

REPO = Path(__file__).resolve().parents[2]

PRETRAIN_GPT = '''
import torch
from megatron.core import parallel_state as mpu
from megatron.core.models.gpt import GPTModel
from megatron.core.transformer.transformer_config import TransformerConfig

_ARGS = {}
CALLS = []


def initialize_megatron(extra_args_provider=None, args_defaults={}):
    CALLS.append("initialize_megatron")
    _ARGS.update(num_layers=2, hidden_size=32, num_attention_heads=4, vocab_size=16, seq_length=32, load=None)
    mpu.initialize_model_parallel(1, 1)


def model_provider(pre_process=True, post_process=True):
    from verl_bridge.compat import make_cpu_safe
    from verl_bridge.models.spec import get_portable_gpt_layer_spec

    CALLS.append("model_provider")
    config = TransformerConfig(num_layers=_ARGS["num_layers"], hidden_size=_ARGS["hidden_size"],
                               num_attention_heads=_ARGS["num_attention_heads"], normalization="LayerNorm",
                               use_cpu_initialization=True, bias_dropout_fusion=False, masked_softmax_fusion=False,
                               gradient_accumulation_fusion=False, persist_layer_norm=False,
                               bias_activation_fusion=False, hidden_dropout=0.0, attention_dropout=0.0)
    return make_cpu_safe(GPTModel(config=config, transformer_layer_spec=get_portable_gpt_layer_spec("LayerNorm"),
                                  vocab_size=_ARGS["vocab_size"], max_sequence_length=_ARGS["seq_length"],
                                  pre_process=pre_process, post_process=post_process,
                                  position_embedding_type="learned_absolute"))


def load_checkpoint(model, optimizer, opt_param_scheduler):
    CALLS.append("load_checkpoint")
    return 0  # Megatron-LM's loader without --load
'''


def readme_bridge_example() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Bring your own Megatron model (the bridge)"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _ppo_yaml(with_presets: bool) -> str:
    text = (REPO / "templates" / "quickstart.yaml").read_text(encoding="utf-8")
    for old, new in (("total_steps: 40", "total_steps: 2"), ("rollout_batch_size: 128", "rollout_batch_size: 32"),
                     ("mini_batch_size: 64", "mini_batch_size: 32"), ("micro_batch_size: 64", "micro_batch_size: 32"),
                     ("log_every: 5", "log_every: 1")):
        assert old in text, old
        text = text.replace(old, new)
    if not with_presets:
        text = text.replace("actor: {type: megatron, args: {preset: tiny}}", "actor: {type: megatron}")
        text = text.replace("critic: {type: megatron, args: {preset: tiny}}", "critic: {type: megatron}")
        assert "preset" not in text.split("model:")[1].split("data:")[0]
    return text


def _run_readme(rank, world_size, root, with_presets):
    os.chdir(root)
    sys.path.insert(0, str(root))
    (root / "my_project").mkdir()
    (root / "my_project" / "__init__.py").write_text("")
    (root / "my_project" / "pretrain_gpt.py").write_text(PRETRAIN_GPT)
    (root / "ppo.yaml").write_text(_ppo_yaml(with_presets))
    exec(compile(readme_bridge_example(), "README.md", "exec"), {"__name__": "readme_example"})
    from my_project import pretrain_gpt

    metrics = [json.loads(line) for line in (root / "runs" / "quickstart" / "metrics.jsonl").read_text().splitlines()]
    config = (root / "runs" / "quickstart" / "config.yaml").read_text()
    return {"calls": pretrain_gpt.CALLS, "steps": [m["step"] for m in metrics], "config": config}


@pytest.mark.parametrize("with_presets", [True, False], ids=["template-as-shipped", "no-model-source"])
def test_readme_bridge_example_runs_as_written(tmp_path, capfd, with_presets):
    r = run_distributed(_run_readme, 1, tmp_path, with_presets)[0]
    assert r["steps"] == [1, 2]
    assert r["calls"][0] == "initialize_megatron" and "load_checkpoint" in r["calls"]
    assert r["calls"].count("model_provider") == 3  # actor, reference, critic: all the user's model
    assert "model_provider: my_project.pretrain_gpt:model_provider" in r["config"]
    assert "preset: tiny" not in r["config"]
    out = capfd.readouterr().out
    cleared = ("[INFO] model.actor.args.preset=tiny, model.critic.args.preset=tiny cleared: the model comes from "
               "the bridge's model_provider (my_project.pretrain_gpt:model_provider)")
    assert (cleared in out) == with_presets


def test_model_source_is_required_where_no_bridge_can_supply_one(tmp_path):
    from verl_bridge.bridge import MegatronBridge
    from verl_bridge.config import ConfigError, load_config

    (tmp_path / "ppo.yaml").write_text(_ppo_yaml(with_presets=False))
    cfg = load_config(tmp_path / "ppo.yaml")  # Python: a bridge may supply the model later
    with pytest.raises(ConfigError, match="model.actor.args: set one of preset .* or pass the model through a "
                                          "MegatronBridge"):
        MegatronBridge.from_config(cfg)  # MegatronTrainer without a bridge: refused before any process group
    with pytest.raises(ConfigError, match="model.actor.args: set one of preset"):
        load_config(tmp_path / "ppo.yaml", require_model_source=True)  # what the CLI loads with


def test_cli_validate_still_reports_a_missing_model_source(tmp_path, capfd):
    from verl_bridge.cli import main

    (tmp_path / "ppo.yaml").write_text(_ppo_yaml(with_presets=False))
    assert main(["validate", str(tmp_path / "ppo.yaml")]) == 2
    captured = capfd.readouterr()
    assert "model.actor.args: set one of preset" in captured.out + captured.err
