"""A trainer step is one unit: a kill between the critic's and the actor's publish, a corrupted
newest step, and a directory without any usable step, each through the real CLI."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SMALL = ["trainer.save_every=1", "data.rollout_batch_size=8", "algorithm.mini_batch_size=8",
         "algorithm.micro_batch_size=8", "algorithm.ppo_epochs=1", "trainer.progress_bar=false"]


def _train(out, steps, *extra):
    cmd = [sys.executable, "-m", "verl_bridge.cli", "train", "templates/quickstart.yaml",
           f"trainer.output_dir={out}", f"trainer.total_steps={steps}", *SMALL, *extra]
    return subprocess.run(cmd, cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True,
                          text=True, timeout=300)


def _steps(run):
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_sigkill_between_critic_and_actor_publish_resumes_previous_step(tmp_path):
    run = tmp_path / "run"
    ckpt = run / "checkpoints"
    args = [f"trainer.output_dir={run}", "trainer.total_steps=3", "trainer.keep_last=1", *SMALL]
    ready_r, ready_w = os.pipe()
    block_r, block_w = os.pipe()
    code = ("from tests.checkpoint.crash_helpers import train_then_hang_between_roles; "
            f"train_then_hang_between_roles({args!r}, {ready_w}, {block_r}, 2)")
    proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(ready_w, block_r), cwd=REPO,
                            env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        assert os.read(ready_r, 1) == b"x"  # step 2: critic renamed into place, actor not yet
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        for fd in (ready_r, ready_w, block_r, block_w):
            os.close(fd)
    # the half-published step 2 is there, but step 1 (keep_last=1) was not pruned and is the one marked
    assert (ckpt / "critic" / "iter_0000002").is_dir() and (ckpt / "actor" / "iter_0000002.tmp-save").is_dir()
    assert sorted(p.name for p in ckpt.glob("step_*")) == ["step_0000001.complete"]
    for role in ("actor", "critic"):
        assert (ckpt / role / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
        assert (ckpt / role / "iter_0000001").is_dir()
    # plain Megatron-LM reading the actor: tracker -> iter_0000001/mp_rank_00/model_optim_rng.pt
    mlm = torch.load(ckpt / "actor" / "iter_0000001" / "mp_rank_00" / "model_optim_rng.pt", weights_only=False)
    assert mlm["iteration"] == 1 and mlm["checkpoint_version"] == 3.0

    # the SIGKILLed run left its run.lock: reported as stale, taken over only when asked (runtime/run_dir.py)
    r = _train(run, 3, "trainer.resume=auto", "trainer.keep_last=1")
    assert r.returncode == 2 and "stale lock" in r.stderr and f"rm {run}/run.lock" in r.stderr, r.stderr[-3000:]
    r = _train(run, 3, "trainer.resume=auto", "trainer.keep_last=1", "trainer.break_stale_lock=true")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from step 1" in r.stdout
    assert _steps(run) == [1, 2, 3]
    assert sorted(p.name for p in ckpt.glob("step_*")) == ["step_0000003.complete"]
    assert sorted(p.name for p in (ckpt / "actor").iterdir()) == ["iter_0000003", "latest_checkpointed_iteration.txt"]
    assert sorted(p.name for p in (ckpt / "critic").iterdir()) == ["iter_0000003", "latest_checkpointed_iteration.txt"]


def _flip(path: Path):
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 3] ^= 0x01
    path.write_bytes(bytes(raw))


@pytest.mark.slow
def test_corrupt_newest_step_falls_back_then_nothing_usable_refuses(tmp_path):
    run = tmp_path / "run"
    victim = tmp_path / "victim.yaml"
    victim.write_text("precious\n")
    run.mkdir()
    (run / "config.yaml").symlink_to(victim)  # config.yaml is replaced, its target never written
    r = _train(run, 3, "trainer.checkpoint_format=torch_dist", "trainer.keep_last=2")
    assert r.returncode == 0, r.stderr[-3000:]
    assert victim.read_text() == "precious\n" and not (run / "config.yaml").is_symlink()
    ckpt = run / "checkpoints"
    bad = ckpt / "actor" / "iter_0000003" / "__0_0.distcp"
    _flip(bad)  # one flipped bit in the newest step's actor
    r = _train(run, 4, "trainer.checkpoint_format=torch_dist", "trainer.keep_last=2", "trainer.resume=auto")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "checkpoint step 3 is unusable" in r.stdout and str(bad) in r.stdout, r.stdout[-3000:]
    assert "resumed from step 2" in r.stdout
    assert _steps(run) == [1, 2, 3, 4]

    for it in (3, 4):  # now break every remaining step
        _flip(ckpt / "critic" / f"iter_{it:07d}" / "__0_0.distcp")
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != "config.yaml"}
    r = _train(run, 5, "trainer.checkpoint_format=torch_dist", "trainer.resume=auto")
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "no usable checkpoint" in r.stderr and "metrics.jsonl" in r.stderr and "iterations [3, 4]" in r.stderr
    assert "trainer.resume=never" in r.stderr and "Traceback" not in r.stderr
    after = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != "config.yaml"}
    assert after == before  # no checkpoint and no metrics truncated or overwritten (config.yaml is
    # rewritten by the trainer's setup, before the resume decision)
