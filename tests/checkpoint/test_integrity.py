"""Corruption never loads silently: checksum manifests, heavy damage, full disks, symlinks, metrics.jsonl."""

import errno
import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from verl_bridge.checkpoint.megatron import latest_valid_iteration, load, save, validate_iteration
from verl_bridge.checkpoint.safe_load import CheckpointError, CorruptCheckpointError


@pytest.fixture(scope="module")
def td(tmp_path_factory):
    """torch_dist iterations 1 and 2 of a tiny llama (model, Adam state, RNG) and a factory for the model."""
    from tests.arch.tiny_hf import make_tiny_hf
    from verl_bridge.arch import hf_model_provider
    from verl_bridge.checkpoint.hf import world_of_one
    from verl_bridge.checkpoint.megatron import capture_rng_state

    root = tmp_path_factory.mktemp("td")
    make_tiny_hf("llama", root / "hf")
    with world_of_one():
        model = hf_model_provider(root / "hf")(True, True)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        for it in (1, 2):
            model(torch.randint(0, 100, (1, 6)), torch.arange(6)[None], None).sum().backward()
            opt.step()
            save(root / "ckpt", it, {"model": model, "optimizer": opt.state_dict(),
                                     "rng_state": capture_rng_state()}, fmt="torch_dist")
    return root


def _copy(td, tmp_path):
    shutil.copytree(td / "ckpt", tmp_path / "ckpt")
    return tmp_path / "ckpt"


def _flip(path: Path, at: float = 0.5):
    raw = bytearray(path.read_bytes())
    raw[int(len(raw) * at)] ^= 0x01
    path.write_bytes(bytes(raw))


def _load(td, d, iteration=None):
    from verl_bridge.arch import hf_model_provider
    from verl_bridge.checkpoint.hf import world_of_one

    with world_of_one():
        model = hf_model_provider(td / "hf", load_weights=False)(True, True)
        return load(d, iteration, model=model)


def test_flipped_byte_in_distcp_is_detected_and_falls_back(td, tmp_path, caplog):
    d = _copy(td, tmp_path)
    bad = d / "iter_0000002" / "__0_0.distcp"
    _flip(bad, 0.3)
    with pytest.raises(CorruptCheckpointError) as exc:
        validate_iteration(d, 2)
    assert str(bad) in str(exc.value) and "sha256" in str(exc.value)
    assert latest_valid_iteration(d) == 1
    with pytest.raises(CorruptCheckpointError, match="__0_0.distcp"):
        _load(td, d, 2)
    with caplog.at_level(logging.WARNING):
        state = _load(td, d)  # auto: the newest good iteration, and the log says why
    assert state["iteration"] == 1
    assert "falling back" in caplog.text and str(bad) in caplog.text


DAMAGE = {
    "distcp truncated": lambda d: (d / "__0_0.distcp").write_bytes((d / "__0_0.distcp").read_bytes()[:5000]),
    "metadata garbage": lambda d: (d / ".metadata").write_bytes(b"\x00garbage" * 50),
    "metadata empty": lambda d: (d / ".metadata").write_bytes(b""),
    "metadata non-utf8": lambda d: (d / ".metadata").write_bytes(b"\x80\x04\x95" + b"\xff\xfe" * 40),
    "common.pt garbage": lambda d: (d / "common.pt").write_bytes(b"\xff\xfe not a zip" * 30),
    "distcp zeroed middle": lambda d: _zero_middle(d / "__0_0.distcp"),
}


def _zero_middle(p):
    raw = bytearray(p.read_bytes())
    n = len(raw)
    raw[n // 4: 3 * n // 4] = bytes(3 * n // 4 - n // 4)
    p.write_bytes(bytes(raw))


@pytest.mark.parametrize("manifest", ["with manifest", "without manifest"])
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_heavy_damage_is_a_named_corruption_never_a_raw_error(damage, manifest, td, tmp_path):
    d = _copy(td, tmp_path)
    it = d / "iter_0000002"
    if manifest == "without manifest":  # e.g. written by Megatron-LM: the readers' own errors are wrapped
        for i in (1, 2):
            (d / f"iter_{i:07d}" / "verl_bridge_manifest.json").unlink()
    DAMAGE[damage](it)
    with pytest.raises(CorruptCheckpointError) as exc:
        _load(td, d, 2)
    assert str(it) in str(exc.value)
    assert _load(td, d)["iteration"] == 1


def _fill_then_enospc(obj, f, *args, **kwargs):
    f.write(b"\0" * 4096)  # part of the file is written, then the disk is full
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_disk_full_monkeypatched_writer(tmp_path, monkeypatch):
    """ENOSPC simulated by monkeypatching torch.save to write 4 KiB then raise OSError(ENOSPC)."""
    save(tmp_path, 1, {"model": {"w": torch.ones(256, 256)}})
    monkeypatch.setattr(torch, "save", _fill_then_enospc)
    with pytest.raises(CheckpointError) as exc:
        save(tmp_path, 2, {"model": {"w": torch.ones(256, 256)}})
    monkeypatch.undo()
    msg = str(exc.value)
    assert "no space left on device" in msg and str(tmp_path / "iter_0000002.tmp-save") in msg
    assert str(256 * 256 * 4 + (1 << 20)) in msg  # the bytes needed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000001", "latest_checkpointed_iteration.txt"]
    validate_iteration(tmp_path, 1)
    assert load(tmp_path)["iteration"] == 1


@pytest.fixture
def tiny_tmpfs(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.parametrize("when", ["before writing", "while writing"])
def test_disk_full_real_tmpfs(when, tiny_tmpfs):
    """A real 3 MiB tmpfs: the pre-flight estimate refuses too-large tensors before writing; a
    non-tensor blob the estimate cannot see fills the disk in the middle of torch.save."""
    save(tiny_tmpfs, 1, {"model": {"w": torch.ones(64, 64)}})
    state = {"model": {"w": torch.ones(1024, 1024)}} if when == "before writing" else \
        {"model": {"w": torch.ones(64, 64)}, "blob": b"x" * (3 << 20)}
    with pytest.raises(CheckpointError) as exc:
        save(tiny_tmpfs, 2, state)
    assert "no space left on device" in str(exc.value) and str(tiny_tmpfs) in str(exc.value)
    assert sorted(p.name for p in tiny_tmpfs.iterdir()) == ["iter_0000001", "latest_checkpointed_iteration.txt"]
    assert load(tiny_tmpfs)["iteration"] == 1


def test_tracker_symlink_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    d = tmp_path / "ckpt"
    save(d, 1, {"model": {"w": torch.ones(2)}})
    (d / "latest_checkpointed_iteration.txt").unlink()
    (d / "latest_checkpointed_iteration.txt").symlink_to(victim)
    save(d, 2, {"model": {"w": torch.ones(2)}})
    assert victim.read_text() == "precious"
    tracker = d / "latest_checkpointed_iteration.txt"
    assert not tracker.is_symlink() and tracker.read_text().strip() == "2"


def test_metrics_symlink_never_written_through(tmp_path, capsys):
    from verl_bridge.runtime.metrics import MetricsFileError, MetricsLogger

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").symlink_to(victim)
    logger = MetricsLogger(str(run), 3, True, False)
    row = {"actor_loss": 0.0, "reward_mean": 0.0, "kl": 0.0, "entropy": 0.0, "throughput_tokens_per_s": 1.0}
    with pytest.raises(MetricsFileError, match="symlink"):
        logger.log(1, row)
    assert victim.read_text() == "precious\n"
    logger.reset()  # a fresh run removes the link itself
    logger.log(1, row)
    assert victim.read_text() == "precious\n" and not (run / "metrics.jsonl").is_symlink()


def test_convert_output_symlink_replaced(tmp_path):
    from tests.arch.tiny_hf import make_tiny_hf
    from verl_bridge.checkpoint.hf import export_hf, import_hf

    make_tiny_hf("llama", tmp_path / "hf")
    import_hf(tmp_path / "hf", tmp_path / "meg")
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"precious")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "model.safetensors").symlink_to(victim)
    export_hf(tmp_path / "meg", tmp_path / "out")
    assert victim.read_bytes() == b"precious"
    assert not (tmp_path / "out" / "model.safetensors").is_symlink()


def _metrics(tmp_path, text):
    from verl_bridge.runtime.metrics import MetricsLogger

    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / "metrics.jsonl").write_text(text)
    return MetricsLogger(str(run), 5, True, False), run / "metrics.jsonl"


def test_metrics_half_written_last_line_dropped_with_warning(tmp_path, capsys):
    logger, path = _metrics(tmp_path, '{"step": 1, "kl": 0.1}\n{"step": 2, "kl": 0.2}\n{"step": 3, "k')
    logger.truncate_after(2)
    assert path.read_text() == '{"step": 1, "kl": 0.1}\n{"step": 2, "kl": 0.2}\n'
    out = capsys.readouterr().out
    assert "half-written last line" in out and "line 3" in out


def test_metrics_corrupt_line_elsewhere_refused(tmp_path):
    from verl_bridge.runtime.metrics import MetricsFileError

    text = '{"step": 1, "kl": 0.1}\n{"step": 2, "kl"::}\n{"step": 3, "kl": 0.3}\n'
    logger, path = _metrics(tmp_path, text)
    with pytest.raises(MetricsFileError) as exc:
        logger.truncate_after(3)
    assert str(path) in str(exc.value) and "line 2" in str(exc.value)
    assert path.read_text() == text  # untouched
