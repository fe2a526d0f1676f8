"""Quiet start: megatron-core's known fallback warnings fold into one [INFO] line; others stay visible."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from verl_bridge.runtime import mcore_notices

REPO = Path(__file__).resolve().parents[2]
FALLBACKS = ("Falling back to Torch optimizers", "Falling back to Torch Norm", "full scope is deprecated")


@pytest.fixture()
def folded(monkeypatch):
    monkeypatch.delenv(mcore_notices.VERBOSE_ENV, raising=False)
    mcore_notices.uninstall()
    yield
    mcore_notices.uninstall()


def _warn_from(path: str, text: str, category=UserWarning):
    # as megatron-core raises them: at import time of a module under megatron/core/
    warnings.warn_explicit(text, category, path, 24, registry={})


def test_known_megatron_warnings_fold_and_others_stay_visible(folded):
    mcore_dir = os.path.join(os.sep, "site-packages", "megatron", "core")
    with warnings.catch_warnings(record=True) as shown:  # what reaches the user's stderr
        warnings.simplefilter("default")
        mcore_notices.install()
        _warn_from(os.path.join(mcore_dir, "optimizer", "__init__.py"),
                   "Transformer Engine and Apex are not installed. Falling back to Torch optimizers.")
        _warn_from(os.path.join(mcore_dir, "models", "backends.py"), "Apex is not installed. Falling back to Torch Norm")
        _warn_from(os.path.join(mcore_dir, "optimizer", "clip_grads.py"),
                   "Transformer Engine and Apex are not installed. Falling back to local implementations of "
                   "multi_tensor_applier, multi_tensor_l2norm, and multi_tensor_scale")
        _warn_from(os.path.join(mcore_dir, "transformer", "transformer_config.py"),
                   "full scope is deprecated. Use empty cuda_graph_scope to capture the whole layer.")
        _warn_from(os.path.join(mcore_dir, "transformer", "transformer_config.py"),  # 0.19.2's wording
                   "full scope is deprecated. Use empty cuda_graph_modules to capture the whole layer.")
        _warn_from(os.path.join(mcore_dir, "transformer", "x.py"), "something megatron says that we do not know")
        _warn_from("/home/user/my_model.py", "Apex is not installed. Falling back to Torch Norm")  # not megatron's
    err = "\n".join(f"{w.filename}: {w.message}" for w in shown)
    assert "something megatron says that we do not know" in err
    assert "my_model.py" in err  # the same text from elsewhere is not folded
    assert "Torch optimizers" not in err and "full scope" not in err and "multi_tensor" not in err
    line = mcore_notices.summary()
    assert line.startswith("megatron-core ") and "torch optimizers" in line and "torch norm" in line
    assert "local multi-tensor kernels" in line and "5 start-up warnings" in line and "VERL_BRIDGE_VERBOSE=1" in line
    assert mcore_notices.summary() is None  # printed once


def test_cuda_stream_advice_is_dropped_only_without_cuda(folded):
    import torch

    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("default")
        mcore_notices.install()
        _warn_from(os.path.join(os.sep, "x", "megatron", "core", "tensor_parallel", "layers.py"),
                   "When using async grad allreduce it is recommended to set the environment variable "
                   "CUDA_DEVICE_MAX_CONNECTIONS to 1 for maximum speedup")
    assert len(shown) == (1 if torch.cuda.is_available() else 0)


def test_verbose_shows_them_in_full(folded, monkeypatch):
    monkeypatch.setenv(mcore_notices.VERBOSE_ENV, "1")
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("default")
        mcore_notices.install()
        _warn_from(os.path.join(os.sep, "x", "megatron", "core", "optimizer", "__init__.py"),
                   "Transformer Engine and Apex are not installed. Falling back to Torch optimizers.")
    assert "Falling back to Torch optimizers" in str(shown[0].message)
    assert "shown above" in mcore_notices.summary()


def _train(tmp_path, *args):
    cmd = [sys.executable, "-m", "verl_bridge.cli", "train", "templates/grpo.yaml", *args,
           f"trainer.output_dir={tmp_path / 'run'}", "trainer.total_steps=1", "data.rollout_batch_size=4",
           "algorithm.group_size=2", "algorithm.mini_batch_size=8", "algorithm.micro_batch_size=4",
           "algorithm.ppo_epochs=1", "trainer.progress_bar=false"]
    e = {k: v for k, v in os.environ.items() if k != mcore_notices.VERBOSE_ENV}
    e["OMP_NUM_THREADS"] = "1"
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=e, timeout=600)


@pytest.mark.slow
def test_two_rank_run_prints_the_line_once_and_none_of_the_warnings(tmp_path):
    r = _train(tmp_path, "--nproc-per-node", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    both = r.stdout + r.stderr
    assert both.count("[INFO] megatron-core ") == 1, both
    assert "no TE/apex" in both or "TE and apex installed" in both
    for text in FALLBACKS:
        assert text not in both, both
    assert "warnings.warn(" not in both
    assert "[INFO] Training step 1:" in r.stdout


def test_dash_v_asks_every_rank_for_the_full_warnings(folded, monkeypatch):
    """``verl-bridge train -v`` sets VERL_BRIDGE_VERBOSE=1 for itself and the torchrun ranks it starts
    (what the variable does is tested above)."""
    from click.testing import CliRunner

    from verl_bridge.commands.train import train

    monkeypatch.delenv(mcore_notices.VERBOSE_ENV, raising=False)
    r = CliRunner().invoke(train, ["-v", str(REPO / "templates" / "quickstart.yaml"), "--dry-run"])
    assert r.exit_code == 0, r.output
    assert os.environ.get(mcore_notices.VERBOSE_ENV) == "1"
    monkeypatch.delenv(mcore_notices.VERBOSE_ENV)


def test_torchs_collective_deprecation_raised_for_megatrons_calls_is_folded(folded):
    """torch 2.13 deprecates all_gather_into_tensor / reduce_scatter_tensor, which megatron-core's SP
    mappings call on every TP/SP forward; the FutureWarning is raised from inside torch (c10d_logger),
    so it is matched by its text. Another FutureWarning from the same file stays visible."""
    c10d = os.path.join(os.sep, "site-packages", "torch", "distributed", "c10d_logger.py")
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("default")
        mcore_notices.install()
        _warn_from(c10d, "`torch.distributed.reduce_scatter_tensor` is deprecated. Please use "
                   "`torch.distributed.reduce_scatter_single` instead.", FutureWarning)
        _warn_from(c10d, "`torch.distributed.all_gather_into_tensor` is deprecated. Please use "
                   "`torch.distributed.all_gather_single` instead.", FutureWarning)
        _warn_from(c10d, "`torch.distributed.something_else` is deprecated.", FutureWarning)
        # megatron's torch_dist strategy on every checkpoint load / save (torch's DCP deprecations)
        _warn_from(os.path.join(os.sep, "site-packages", "typing_extensions.py"),
                   "`load_state_dict` is deprecated and will be removed in future versions. Please use `load` "
                   "instead.", FutureWarning)
        _warn_from(os.path.join(os.sep, "site-packages", "torch", "distributed", "checkpoint", "planner_helpers.py"),
                   "Please use DTensor instead and we are deprecating ShardedTensor.", FutureWarning)
        _warn_from("/home/user/train.py", "Please use DTensor instead and we are deprecating ShardedTensor. Yes",
                   FutureWarning)  # not the exact text: stays visible
    err = "\n".join(str(w.message) for w in shown)
    assert "reduce_scatter_tensor" not in err and "all_gather_into_tensor" not in err
    assert "load_state_dict" not in err
    assert "something_else" in err and "ShardedTensor. Yes" in err
    assert sum("ShardedTensor" in str(w.message) for w in shown) == 1
    line = mcore_notices.summary()
    assert "4 start-up warnings" in line and "reduce_scatter_tensor" in line, line
    assert "DCP load_state_dict" in line and "ShardedTensor" in line, line
