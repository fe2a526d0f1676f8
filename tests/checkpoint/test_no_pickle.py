"""No code runs from a checkpoint: pickle payloads in a torch_dist iteration are refused, never run.

Payloads (:mod:`tests.checkpoint.payloads`) in ``.metadata``, in a byte item of a ``.distcp`` and
in ``common.pt`` would ``touch`` a marker file when unpickled; every test asserts the refusal
names the type and the file, and that the marker file does not exist.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from tests.checkpoint.payloads import POISONS

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hf_ckpt(tmp_path_factory):
    """A torch_dist checkpoint `convert --to hf` can read, with optimizer and RNG byte items."""
    from tests.arch.tiny_hf import make_tiny_hf
    from verl_bridge.arch import hf_model_provider
    from verl_bridge.checkpoint.hf import make_args, world_of_one
    from verl_bridge.checkpoint.megatron import capture_rng_state, save

    root = tmp_path_factory.mktemp("hfckpt")
    make_tiny_hf("llama", root / "hf")
    from transformers import AutoConfig

    with world_of_one():
        model = hf_model_provider(root / "hf")(True, True)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        model(torch.randint(0, 100, (1, 6)), torch.arange(6)[None], None).sum().backward()
        opt.step()
        args = make_args(AutoConfig.from_pretrained(str(root / "hf")), "llama", 1, 1, 128)
        save(root / "ckpt", 3, {"model": model, "optimizer": opt.state_dict(), "rng_state": capture_rng_state(),
                                "args": args, "verl_bridge": {"arch": "llama", "vocab_size": 100}}, fmt="torch_dist")
    return root / "ckpt"


@pytest.mark.parametrize("where", sorted(POISONS))
def test_convert_refuses_payload(where, hf_ckpt, tmp_path):
    from verl_bridge.commands.convert import convert

    src = tmp_path / "ckpt"
    shutil.copytree(hf_ckpt, src)
    marker = tmp_path / "pwned"
    poisoned = POISONS[where](src / "iter_0000003", marker)
    r = CliRunner().invoke(convert, [str(src), str(tmp_path / "out"), "--to", "hf"])
    assert not marker.exists(), "the payload ran"
    assert r.exit_code == 2, r.output
    assert "posix.system" in r.output and "allowlist" in r.output and str(poisoned) in r.output, r.output
    assert "Traceback" not in r.output
    assert not (tmp_path / "out").exists()


def test_clean_checkpoint_still_converts(hf_ckpt, tmp_path):
    """Control: the same checkpoint unpoisoned converts (the allowlist covers real files)."""
    from verl_bridge.commands.convert import convert

    r = CliRunner().invoke(convert, [str(hf_ckpt), str(tmp_path / "out"), "--to", "hf"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_load_refuses_then_trust_opt_in(hf_ckpt, tmp_path):
    """``load(trust=True)`` is the explicit opt-in for a trusted file (here it runs the payload)."""
    from verl_bridge.arch import hf_model_provider
    from verl_bridge.checkpoint.hf import world_of_one
    from verl_bridge.checkpoint.megatron import load
    from verl_bridge.checkpoint.safe_load import CheckpointError

    src = tmp_path / "ckpt"
    shutil.copytree(hf_ckpt, src)
    marker = tmp_path / "pwned"
    POISONS[".distcp"](src / "iter_0000003", marker)
    with world_of_one():
        model = hf_model_provider(hf_ckpt.parent / "hf", load_weights=False)(True, True)
        with pytest.raises(CheckpointError, match=r"__0_0\.distcp.*posix\.system"):
            load(src, 3, model=model)
        assert not marker.exists()
        load(src, 3, model=model, trust=True)
    assert marker.exists()  # the opt-in really is full unpickling


def _train(out, *extra):
    cmd = [sys.executable, "-m", "verl_bridge.cli", "train", str(REPO / "templates/quickstart.yaml"),
           f"trainer.output_dir={out}", "trainer.total_steps=2", "trainer.save_every=1",
           "trainer.checkpoint_format=torch_dist", "data.rollout_batch_size=8", "algorithm.mini_batch_size=8",
           "algorithm.micro_batch_size=8", "algorithm.ppo_epochs=1", "trainer.progress_bar=false", *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "run"
    r = _train(out)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("role,where", [("actor", ".metadata"), ("actor", ".distcp"), ("actor", "common.pt"),
                                        ("critic", ".distcp")])
def test_resume_refuses_payload(role, where, trained_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    marker = tmp_path / "pwned"
    poisoned = POISONS[where](run / "checkpoints" / role / "iter_0000002", marker)
    r = _train(run, "trainer.resume=auto")
    assert not marker.exists(), "the payload ran"
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-3000:]
    assert "posix.system" in r.stderr and "allowlist" in r.stderr and str(poisoned) in r.stderr, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
