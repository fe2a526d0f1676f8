"""Crash safety: SIGKILL during a save, corrupted files, keep-last-N, safe loading."""

import os
import signal
import subprocess
import sys

import pytest
import torch

from verl_bridge.checkpoint.megatron import latest_valid_iteration, load, save
from verl_bridge.checkpoint.safe_load import CheckpointError, CorruptCheckpointError, safe_load


def test_sigkill_during_save_keeps_previous_checkpoint(tmp_path):
    ready_r, ready_w = os.pipe()
    block_r, block_w = os.pipe()
    code = ("import sys; from tests.checkpoint.crash_helpers import save_then_hang; "
            f"save_then_hang({str(tmp_path)!r}, 'legacy', {ready_w}, {block_r})")
    proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(ready_w, block_r), cwd=os.getcwd())
    try:
        assert os.read(ready_r, 1) == b"x"  # the child is inside torch.save of iteration 2
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        for fd in (ready_r, ready_w, block_r, block_w):
            os.close(fd)
    assert (tmp_path / "iter_0000002.tmp-save").is_dir()  # the unfinished save is there...
    assert not (tmp_path / "iter_0000002").exists()  # ...but never became visible
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
    assert latest_valid_iteration(tmp_path) == 1
    state = load(tmp_path)
    assert state["iteration"] == 1 and state["extra"]["data_position"] == 1
    # the next save cleans the leftover and succeeds
    save(tmp_path, 2, {"model": {"w": torch.zeros(2)}, "iteration": 2})
    assert latest_valid_iteration(tmp_path) == 2 and not (tmp_path / "iter_0000002.tmp-save").exists()


@pytest.mark.parametrize("fmt", ["legacy"])
def test_corrupted_checkpoint_names_file_and_falls_back(tmp_path, fmt):
    for it in (1, 2):
        save(tmp_path, it, {"model": {"w": torch.full((64, 64), float(it))}, "iteration": it}, fmt=fmt)
    bad = tmp_path / "iter_0000002" / "mp_rank_00" / "model_optim_rng.pt"
    data = bad.read_bytes()
    bad.write_bytes(data[: len(data) // 2])  # truncated
    with pytest.raises(CorruptCheckpointError) as exc:
        load(tmp_path, 2)
    assert str(bad) in str(exc.value)
    assert latest_valid_iteration(tmp_path) == 1
    state = load(tmp_path)  # auto: falls back to the previous complete checkpoint
    assert state["iteration"] == 1 and torch.equal(state["model"]["w"], torch.full((64, 64), 1.0))
    # bit flip inside the tensor data: the zip CRC catches it
    good = tmp_path / "iter_0000001" / "mp_rank_00" / "model_optim_rng.pt"
    raw = bytearray(good.read_bytes())
    idx = raw.find(torch.full((64, 64), 1.0).numpy().tobytes()[:64])
    raw[idx + 10] ^= 0xFF
    good.write_bytes(bytes(raw))
    assert latest_valid_iteration(tmp_path) is None
    with pytest.raises(CheckpointError, match="no loadable checkpoint"):
        load(tmp_path)


def test_keep_last_n(tmp_path):
    for it in range(1, 6):
        save(tmp_path, it * 10, {"model": {"w": torch.ones(1)}}, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "iter_0000040", "iter_0000050", "latest_checkpointed_iteration.txt"]


class NotAllowed:
    pass


def test_safe_load_refuses_unknown_types_and_names_file(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"obj": NotAllowed()}, path)
    with pytest.raises(CheckpointError) as exc:
        safe_load(path)
    assert str(path) in str(exc.value) and "NotAllowed" in str(exc.value)
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint" * 10)
    with pytest.raises(CorruptCheckpointError, match="garbage.pt"):
        safe_load(garbage)
    with pytest.warns(UserWarning, match="weights_only=False"):
        assert isinstance(safe_load(path, trust=True)["obj"], NotAllowed)
