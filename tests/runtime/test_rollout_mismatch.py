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
import torch

from tests.dist_utils import run_distributed

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


def _engine_log_probs(rank, world_size):
    from types import SimpleNamespace as NS

    from verl_bridge.distributed import init_model_parallel, seed_everything
    from verl_bridge.models.tiny import tiny_model_provider
    from verl_bridge.rollout.base import SamplingParams
    from verl_bridge.rollout.native import NativeEngine
    from verl_bridge.rollout.verify import next_token_log_probs
    from verl_bridge.common.batch import model_inputs

    init_model_parallel(1, 1)
    seed_everything(0)
    args = NS(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=None, ffn_hidden_size=None)
    model = tiny_model_provider(args, 32, 32)(True, True)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, 32, (6, 5), generator=g).tolist()
    out = {}
    for path, fast in (("module", False), ("fast_decoder_eager", True)):
        eng = NativeEngine(model, torch.device("cpu"), fast=fast)
        for name, kw in (("t1", dict(temperature=1.0)), ("t07_topk5", dict(temperature=0.7, top_k=5))):
            b = eng.generate(prompts, SamplingParams(max_new_tokens=6, eos_token_id=None, pad_token_id=0, **kw), seed=3)
            # the trainer's forward (T=1) on the padded sequences, as make_experience runs it
            ids, pos, mask = model_inputs(b.input_ids, b.attention_mask)
            with torch.no_grad():
                lp = next_token_log_probs(model(ids, pos, mask), ids, 32)
            plen = b.prompt_ids.shape[1]
            train = lp[:, plen - 1:]
            out[(path, name)] = (float((train - b.log_probs).abs().max()), float(b.log_probs.max()),
                                 b.log_probs.tolist())
    return out


def test_both_native_paths_return_the_log_probs_they_sampled_with():
    import math

    r = run_distributed(_engine_log_probs, 1)[0]
    for path in ("module", "fast_decoder_eager"):
        diff, top, _ = r[(path, "t1")]
        assert diff < 1e-4 and top < 0, (path, diff)  # temperature 1, no filter: the trainer's own log-probs
        diff, top, lps = r[(path, "t07_topk5")]
        assert diff > 1e-3  # sampled from the sharpened, top-5 distribution: not the trainer's T=1 log-probs
        assert all(math.isfinite(x) and x <= 0 for row in lps for x in row)
