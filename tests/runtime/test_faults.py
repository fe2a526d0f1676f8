"""Faults of a real run (2 gloo ranks under ``verl-bridge train --nproc-per-node 2``, tiny GPT, CPU):
one run per output directory, SIGTERM saving a resumable checkpoint, the launcher taking its ranks
down when it is SIGKILLed, and a SIGSTOPped TP peer ending the job within the collective timeout."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.dist_utils import clean_env

REPO = Path(__file__).resolve().parents[2]
CONFIG = """\
trainer: {args: {tp_size: 2, pp_size: 1}, total_steps: 1000000, seed: 1, log_every: 1, progress_bar: false}
model:
  actor: {type: megatron, args: {preset: tiny, num_layers: 1, hidden_size: 32}}
  reward: {type: function}
data: {task: repeat, rollout_batch_size: 4, max_prompt_length: 8, max_response_length: 4}
algorithm: {name: grpo, group_size: 2, ppo_epochs: 1, mini_batch_size: 8, micro_batch_size: 8}
optim: {actor: {lr: 1.0e-3}}
"""
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc: Linux")


@pytest.fixture
def cfg(tmp_path):
    p = tmp_path / "cfg.yaml"
    p.write_text(CONFIG)
    return p


def _start(cfg, out, *overrides, nproc=2):
    log = open(out.parent / f"{out.name}.log", "ab")
    cmd = [sys.executable, "-m", "verl_bridge.cli", "train", str(cfg), f"--nproc-per-node={nproc}",
           f"trainer.output_dir={out}", *overrides]
    # launched as from a plain shell: no torch.distributed variables an earlier test left in this process
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=cfg.parent, env=clean_env())


def _log(out) -> str:
    return (out.parent / f"{out.name}.log").read_text(errors="replace")


def _steps(out) -> list[int]:
    p = out / "metrics.jsonl"
    if not p.exists():
        return []
    return [json.loads(line)["step"] for line in p.read_text().splitlines() if line.strip()]


def _wait_steps(proc, out, n, timeout=240):
    end = time.monotonic() + timeout
    while len(_steps(out)) < n:
        assert proc.poll() is None, f"the run ended early (rc {proc.returncode}):\n{_log(out)[-3000:]}"
        assert time.monotonic() < end, f"no {n} steps within {timeout} s:\n{_log(out)[-3000:]}"
        time.sleep(0.2)


def _ranks(out) -> dict[int, int]:
    """{RANK: pid} of the rank processes of the run writing to ``out`` (from /proc)."""
    found = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0")
            if b"verl_bridge.train" not in cmd or f"trainer.output_dir={out}".encode() not in cmd:
                continue
            if b"torch.distributed.run" in cmd:  # torchrun itself (its argv names the rank module too)
                continue
            env = dict(kv.split(b"=", 1) for kv in Path(f"/proc/{d}/environ").read_bytes().split(b"\0") if b"=" in kv)
            if b"RANK" in env:
                found[int(env[b"RANK"])] = int(d)
        except (OSError, ValueError):
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _kill_all(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.slow
def test_sigterm_saves_resumable_checkpoint_then_resume_continues(cfg, tmp_path):
    out = tmp_path / "run"
    proc = _start(cfg, out, "trainer.save_every=100")
    try:
        _wait_steps(proc, out, 3)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=120)
    finally:
        _kill_all(_ranks(out).values())
    log = _log(out)
    assert rc == 143, log[-3000:]
    steps = _steps(out)
    last = steps[-1]
    assert steps == list(range(1, last + 1)) and last >= 3
    assert f"stopped by SIGTERM after step {last}; checkpoint of step {last} saved" in log, log[-3000:]
    assert "trainer.resume=auto" in log
    tracker = out / "checkpoints" / "actor" / "latest_checkpointed_iteration.txt"
    assert tracker.read_text().strip() == str(last)
    assert not (out / "run.lock").exists()  # released on the way out
    # resume: the metrics continue step by step
    proc = _start(cfg, out, "trainer.resume=auto", f"trainer.total_steps={last + 2}")
    assert proc.wait(timeout=240) == 0, _log(out)[-3000:]
    assert f"resumed from step {last}" in _log(out)
    assert _steps(out) == list(range(1, last + 3))


@pytest.mark.slow
def test_launcher_sigkill_takes_its_ranks_down(cfg, tmp_path):
    out = tmp_path / "run"
    proc = _start(cfg, out)
    try:
        _wait_steps(proc, out, 1)
        ranks = _ranks(out)
        assert sorted(ranks) == [0, 1], ranks
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        end = time.monotonic() + 60
        while any(_alive(p) for p in ranks.values()) and time.monotonic() < end:
            time.sleep(0.2)
        left = [p for p in ranks.values() if _alive(p)]
        assert not left, f"ranks {left} outlived their launcher"
        assert not _ranks(out)  # the pgrep-style check: no rank of this run is left
    finally:
        _kill_all(_ranks(out).values())


@pytest.mark.slow
def test_stopped_tp_peer_ends_the_job_within_the_timeout(cfg, tmp_path):
    out = tmp_path / "run"
    proc = _start(cfg, out, "trainer.collective_timeout_s=5")
    ranks = {}
    try:
        _wait_steps(proc, out, 2)
        ranks = _ranks(out)
        os.kill(ranks[1], signal.SIGSTOP)
        t0 = time.monotonic()
        rc = proc.wait(timeout=120)
        elapsed = time.monotonic() - t0
    finally:
        for pid in ranks.values():
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        _kill_all(_ranks(out).values())
    log = _log(out)
    print(f"\nSIGSTOP of rank 1 -> launcher exit {rc} after {elapsed:.1f} s; "
          + next((ln for ln in log.splitlines() if "did not complete within" in ln), ""))
    assert rc != 0
    assert "rank 0:" in log and "did not complete within trainer.collective_timeout_s=5 s" in log, log[-4000:]
    assert f"rank 1 (host " in log and f"pid {ranks[1]}): no heartbeat" in log, log[-4000:]
    # the collective and its caller outside torch, e.g. "all_gather (called from verl_bridge/compat/cpu.py:83 forward)",
    # or megatron's TP linear backward waiting on its async dgrad all-reduce (no torch frame names the op):
    # "wait() on an async collective (called from megatron/core/tensor_parallel/layers.py:NNN backward)"
    assert re.search(r"rank 0: (\w+|wait\(\) on an async collective) \(called from (verl_bridge|megatron)/[\w/]+\.py:\d+ \w+\)", log), log[-4000:]
    # the surviving rank kills the stopped peer (same host) itself: 5 s timeout + teardown slack on 2
    # shared cores, not torchrun's 30 s grace
    assert "has been killed so the job ends now" in log, log[-4000:]
    assert elapsed < 5 + 20, elapsed
    assert not any(_alive(p) for p in ranks.values())


def test_one_run_per_output_dir(cfg, tmp_path):
    """A live holder is refused (exit 2, host and pid named); a stale lock is reported with the fix;
    a directory holding another run is refused unless resume=auto or overwrite=true."""
    from verl_bridge.runtime.run_dir import RunDirError, claim_run_dir

    out = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from verl_bridge.runtime.run_dir import claim_run_dir; "
         f"claim_run_dir({str(out)!r}, resume='never', overwrite=False, break_stale=False); "
         "print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    one = ["trainer.total_steps=1"]
    r = subprocess.run([sys.executable, "-m", "verl_bridge.cli", "train", str(cfg), f"trainer.output_dir={out}",
                        "trainer.args.tp_size=1", *one], capture_output=True, text=True, timeout=240)
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"is in use by pid {holder.pid} on host" in r.stderr
    holder.kill()
    holder.wait()
    # the holder died without releasing: stale, reported with the way out, not taken silently
    with pytest.raises(RunDirError) as e:
        claim_run_dir(str(out), resume="never", overwrite=False, break_stale=False)
    msg = str(e.value)
    assert f"stale lock {out}/run.lock left by pid {holder.pid}" in msg and f"rm {out}/run.lock" in msg
    os.unlink(out / "run.lock")  # the printed fix
    r = subprocess.run([sys.executable, "-m", "verl_bridge.cli", "train", str(cfg), f"trainer.output_dir={out}",
                        "trainer.args.tp_size=1", *one], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    run_id = json.loads((out / "run.json").read_text())["run_id"]
    # a second new run in the same directory: refused, the first run untouched
    before = sorted(p.name for p in (out / "checkpoints" / "actor").iterdir())
    r = subprocess.run([sys.executable, "-m", "verl_bridge.cli", "train", str(cfg), f"trainer.output_dir={out}",
                        "trainer.args.tp_size=1", *one], capture_output=True, text=True, timeout=240)
    assert r.returncode == 2
    assert f"already holds a run (metrics.jsonl and checkpoints/, run {run_id})" in r.stderr
    assert "trainer.resume=auto" in r.stderr and "trainer.overwrite=true" in r.stderr
    assert sorted(p.name for p in (out / "checkpoints" / "actor").iterdir()) == before
    assert _steps(out) == [1]
    # stale lock taken over on request, and overwrite replaces the old run (its checkpoints are gone)
    import socket

    (out / "run.lock").write_text(json.dumps({"host": socket.gethostname(), "pid": holder.pid, "run_id": "x"}))
    r = subprocess.run([sys.executable, "-m", "verl_bridge.cli", "train", str(cfg), f"trainer.output_dir={out}",
                        "trainer.args.tp_size=1", "trainer.total_steps=2", "trainer.save_every=2",
                        "trainer.overwrite=true", "trainer.break_stale_lock=true"],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "took over the stale lock" in r.stdout + r.stderr and "deleted the previous run's" in r.stdout + r.stderr
    assert sorted(p.name for p in (out / "checkpoints" / "actor").iterdir()) == [
        "iter_0000002", "latest_checkpointed_iteration.txt"]
    assert json.loads((out / "run.json").read_text())["run_id"] != run_id
    assert _steps(out) == [1, 2]


@pytest.mark.slow
def test_sigint_single_process_saves_and_exits_130(cfg, tmp_path):
    """``python -m verl_bridge.train`` (a world of one, no torchrun): Ctrl-C saves the last finished step."""
    out = tmp_path / "run"
    log = open(tmp_path / "run.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "verl_bridge.train", "--config_file", str(cfg),
                             f"trainer.output_dir={out}", "trainer.args.tp_size=1"],
                            stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        _wait_steps(proc, out, 2)
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = (tmp_path / "run.log").read_text(errors="replace")
    last = _steps(out)[-1]
    assert rc == 130, text[-3000:]
    assert f"stopped by SIGINT after step {last}; checkpoint of step {last} saved" in text
    tracker = out / "checkpoints" / "actor" / "latest_checkpointed_iteration.txt"
    assert tracker.read_text().strip() == str(last)
