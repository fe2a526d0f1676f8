"""Megatron-LM's own flow -> verl-bridge GRPO on a GPU (tests/gpu/megatron_lm_flow.py, one command).

Skipped without CUDA or without Megatron-LM's ``megatron.training`` (megatron-core >= 0.17 wheels
ship it; CPU CI has 0.16.1). The CPU half of the same path: tests/bridge/test_megatron_lm_flow.py.
"""

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent / "megatron_lm_flow.py"


def _has_megatron_training() -> bool:
    try:
        return importlib.util.find_spec("megatron.training") is not None
    except ImportError:
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.skipif(not _has_megatron_training(), reason="needs megatron.training (megatron-core >= 0.17)")
def test_megatron_lm_checkpoints_train_with_grpo(tmp_path):
    out = tmp_path / "summary.json"
    rc = subprocess.run([sys.executable, str(SCRIPT), "--workdir", str(tmp_path), "--steps", "3",
                         "--json", str(out)]).returncode
    summary = json.loads(out.read_text())
    assert rc == 0 and summary["ok"]
    assert summary["save"]["wrapper"] == "Float16Module"
    assert summary["save"]["layernorm_dtype"] == summary["save"]["position_embedding_dtype"] == "torch.bfloat16"
    for fmt in ("torch", "torch_dist"):
        r = summary[fmt]
        assert r["loaded"]["exact"] and not r["loaded"]["missing"] and r["loaded"]["dtypes"] == ["bfloat16"]
        assert r["actor_dtypes"] == ["torch.bfloat16"] and r["decode_path"] == "fast" and r["reused_megatron_groups"]
        assert [s["step"] for s in r["steps"]] == [1, 2, 3]
        assert all(math.isfinite(s["reward_mean"]) and math.isfinite(s["actor_loss"]) for s in r["steps"])
    assert summary["example_rc"] == 0 and summary["example_steps"] == 1
