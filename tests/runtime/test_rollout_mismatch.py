"""Every training step logs the rollout-training mismatch; for the native engine in fp32 it is ~0.

The native engine samples with megatron's KV-cache forward and returns the log-probs it sampled
with; the trainer's old log-probs come from the full forward on the same weights, so in fp32 the
two agree to rounding (a real difference, e.g. a stale sync, would show in whole units). With
``algorithm.rollout_correction: {type: tis, cap: 2.0}`` the truncated importance weights are then
~1. Runs the real CLI on the quickstart template for a few steps.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _rows(run_dir: Path, *overrides: str) -> list[dict]:
    cmd = [sys.executable, "-m", "verl_bridge.cli", "train", "templates/quickstart.yaml", f"trainer.output_dir={run_dir}",
           "trainer.progress_bar=false", "trainer.total_steps=3", *overrides]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_native_engine_mismatch_is_logged_and_near_zero_in_fp32(tmp_path):
    rows = _rows(tmp_path / "plain")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert 0.0 <= r["mismatch/logprob_abs_mean"] < 1e-4, r
        assert 0.0 <= r["mismatch/kl_k3"] < 1e-6, r
        assert "tis/weight_mean" not in r  # off by default
    tis = _rows(tmp_path / "tis", "algorithm.rollout_correction={type: tis, cap: 2.0}")
    for r, p in zip(tis, rows):
        assert abs(r["tis/weight_mean"] - 1.0) < 1e-4 and r["tis/capped_frac"] == 0.0, r
        assert r["mismatch/logprob_abs_mean"] < 1e-4
    # weights of ~1: the same training as without the correction
    assert tis[-1]["reward_mean"] == pytest.approx(rows[-1]["reward_mean"], abs=1e-6)
