"""The quickstart learns at TP=2 too: two gloo processes through the real CLI (``--nproc-per-node 2``).

Same acceptance as tests/runtime/test_learning.py (mean reward rises >= 0.3 and ends >= 0.8 over
40 steps), read from the run's metrics.jsonl; the first-five / last-five means are printed (the
README's megatron-core table quotes them per version).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime.test_learning import _check_learning

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quickstart_ppo_learns_at_tp2(tmp_path):
    import megatron.core

    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "verl_bridge.cli", "train", "templates/quickstart.yaml", "--nproc-per-node", "2",
           "trainer.args.tp_size=2", f"trainer.output_dir={run}", "trainer.progress_bar=false"]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "[INFO] MegatronTrainer initialized with TP=2, PP=1, SP=False" in r.stdout
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 40
    first = sum(row["reward_mean"] for row in rows[:5]) / 5
    last = sum(row["reward_mean"] for row in rows[-5:]) / 5
    print(f"quickstart TP=2 on megatron-core {megatron.core.__version__}: reward first5={first:.3f} last5={last:.3f}")
    _check_learning(rows, ("critic_loss",))
