"""`verl-bridge --help` must import neither torch nor megatron and answer fast."""

import subprocess
import sys
import time

CHECK = (
    "import sys; from verl_bridge.cli import main; rc = main(['--help']); "
    "bad = [m for m in sys.modules if m == 'torch' or m.startswith('megatron') or m.startswith('torch.')]; "
    "print('HEAVY', bad)"
)


def test_help_imports_no_torch_or_megatron():
    r = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "HEAVY []" in r.stdout, r.stdout
    for name in ("train", "migrate", "doctor", "convert", "plot"):
        assert name in r.stdout


def test_help_is_fast():
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "verl_bridge.cli", "--help"], capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    assert r.returncode == 0
    assert elapsed < 1.0, f"--help took {elapsed:.2f}s"


def test_unknown_command_is_a_usage_error():
    r = subprocess.run([sys.executable, "-m", "verl_bridge.cli", "frobnicate"], capture_output=True, text=True)
    assert r.returncode == 2
    assert "No such command" in r.stderr
