"""CPU smoke runs of the benchmark scripts (tiny shapes), so that a benchmark cannot rot unnoticed.

Each script runs as a user runs it (``python benchmarks/NAME.py --small``) in a subprocess, with
``BENCH_RESULTS_DIR`` pointing at a temporary folder so the committed CUDA results are never
overwritten. The test checks the DESIGN.md result contract and that both sides really measured
(a positive tokens/s or bandwidth on each side, a finite ratio). The CUDA numbers in the README
come from ``benchmarks/run_cuda.sh`` on the H200; these runs only prove the scripts work on
today's code.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.dist_utils import clean_env

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = {"name", "device", "when", "config", "results", "baseline", "ratio"}


def _run(name: str, tmp_path: Path, timeout: int = 420, args: tuple = ()) -> dict:
    # a user runs the script from a plain shell: no torch.distributed variables left by earlier tests in
    # this pytest process (accelerate, under TRL, reads WORLD_SIZE/RANK and would rendezvous over env://)
    env = clean_env(BENCH_RESULTS_DIR=str(tmp_path), PYTHONWARNINGS="ignore",
                    PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    env.pop("BENCH_OUT", None)
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), "--small", *args], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"benchmarks/{name}.py --small exited {p.returncode}:\n{p.stderr[-3000:]}"
    out = json.loads((tmp_path / f"{name}-cpu.json").read_text())
    assert CONTRACT <= set(out), f"result misses contract keys {CONTRACT - set(out)}"
    assert out["name"] == name and out["device"] == "cpu"
    return out


def _finite_positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@pytest.mark.slow
def test_rollout_benchmark_runs(tmp_path):
    out = _run("rollout", tmp_path, args=("--early-eos", "32:48:8"))
    r, b = out["results"], out["baseline"]
    # the model is built as the trainer builds it, so the megatron forward equals the HF one it came from
    assert r["check_megatron_vs_hf_max_abs_logit_diff"] < 1e-4
    assert r["check_fast_vs_megatron_max_abs_logit_diff"] < 1e-4
    assert _finite_positive(r["native_tokens_per_s"]) and _finite_positive(b["hf_dynamic_tokens_per_s"])
    assert _finite_positive(out["ratio"])
    rl = r["rl_sizes"]  # the RL-batch section ran too (1024 new tokens and the roofline on CUDA)
    assert rl and all(_finite_positive(x["native_tokens_per_s"]) for x in rl)
    # --early-eos: rows end at many lengths (EOS raised to a per-step probability of ~1/8); compaction
    # computes fewer row-steps than the same decoder without it, which computes every row until all end
    e = r["early_eos"]
    on, off = e["engines"]["compacting"], e["engines"]["not_compacting"]
    assert 3 < on["mean_response_len"] < 20 and 3 < off["mean_response_len"] < 20, e
    assert on["row_steps"] < on["row_steps_uncompacted"] and on["final_batch"] < 32, on
    assert off["row_steps"] == off["row_steps_uncompacted"] and off["final_batch"] == 32, off
    assert _finite_positive(e["compaction_speedup"])


@pytest.mark.slow
def test_weight_export_benchmark_runs(tmp_path):
    out = _run("weight_export", tmp_path)
    r = out["results"]
    assert r["check_missing_names"] == [] and r["check_mismatched_tensors"] == []
    assert _finite_positive(r["export_GBps"]) and _finite_positive(r["general_path_GBps"])
    assert _finite_positive(r["general_coalesced_GBps"]) and r["general_coalesced_peak_extra_bytes"] > 0
    assert _finite_positive(out["baseline"]["copy_GBps"]) and _finite_positive(out["ratio"])


@pytest.mark.slow
def test_rl_step_benchmark_runs(tmp_path):
    pytest.importorskip("trl", reason="the comparison side (TRL GRPOTrainer) needs `trl` (in the test extra)")
    out = _run("rl_step", tmp_path, timeout=600, args=("--runs", "2"))
    r, b = out["results"], out["baseline"]
    assert "error" not in b, b.get("error")
    assert _finite_positive(r["tokens_per_s"]) and _finite_positive(b["tokens_per_s"])
    assert _finite_positive(out["ratio"])
    # --runs: each run's ratio from fresh processes of both sides; the first is the headline's
    assert len(r["runs"]) == 2 and r["runs"][0]["ratio"] == out["ratio"]
    assert all(_finite_positive(x["ratio"]) for x in r["runs"])
    assert r["ratio_min_over_runs"] == min(x["ratio"] for x in r["runs"])
    # the update's own time (time_update_s) is inside the train time, which adds the weight sync and check
    assert 0 < r["update_s"] <= r["train_s"]


@pytest.mark.slow
def test_kernel_profile_runs(tmp_path):
    """The profile behind #24's "where the time goes" runs both parts on today's code. On CPU the
    profiler records no GPU kernels, so only the timings and the update's FLOP accounting are checked."""
    out = _run("kernel_profile", tmp_path)
    dec, upd = out["results"]["decode"], out["results"]["update"]
    assert dec and all("error" not in d and _finite_positive(d["tokens_per_s"]) for d in dec), dec
    for label in ("micro_batch_16_rows", "token_budget_one_micro_batch", "token_budget_eager_layers"):
        u = upd[label]
        assert "error" not in u, u.get("error")
        assert u["real_tokens"] == u["tokens"] > 0 and _finite_positive(u["update_wall_s"])
        assert _finite_positive(u["model_tflop"]) and "by_class_us" in u["profile"]


def test_kernel_classes():
    """Kernel names as CUPTI reports them on the H100/H200 land in the class the profile reports."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.kernel_profile import kernel_class

    assert kernel_class("nvjet_sm90_tst_128x192_64x5_1x2_h_bz_coopB_NNN") == "gemm"
    assert kernel_class("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7") == "attention"
    assert kernel_class("fmha_cutlassF_bf16_aligned_64x64_rf_sm80") == "attention"
    assert kernel_class("triton_red_fused__to_copy_argmax_logsumexp_rand_14") == "triton (inductor-fused)"
    assert kernel_class("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>") == \
        "reduction/softmax/norm"
    assert kernel_class("void at::native::elementwise_kernel<128, 4, gpu_kernel_impl_nocast<direct_copy_kernel_cuda") \
        == "copy/index/cat"
    assert kernel_class("void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add<float>>") == "elementwise"


def test_results_dir_redirect(tmp_path, monkeypatch):
    """BENCH_RESULTS_DIR decides where write_result puts the JSON (smoke runs never touch results/)."""
    monkeypatch.setenv("BENCH_RESULTS_DIR", str(tmp_path))
    code = ("import sys, torch; sys.path.insert(0, %r); from benchmarks import _common as C; "
            "C.write_result('probe', torch.device('cpu'), {}, {'x': 1}, {'y': 2}, 0.5)") % str(ROOT)
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, env=dict(os.environ))
    out = json.loads((tmp_path / "probe-cpu.json").read_text())
    assert out["ratio"] == 0.5 and out["results"] == {"x": 1}
    assert not (ROOT / "benchmarks" / "results" / "probe-cpu.json").exists()
