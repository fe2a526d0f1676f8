"""The command itself: speed, --issue redaction, exit codes, no heavy imports."""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
import time

from .fakeenv import FakeEnv


def test_doctor_module_does_not_import_torch_or_megatron():
    code = ("import sys, verl_bridge.doctor.command, verl_bridge.doctor.runner, verl_bridge.doctor.explain;"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron', 'vllm', 'transformer_engine')];"
            "print(bad); sys.exit(1 if bad else 0)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def test_real_environment_within_five_seconds():
    """This machine's venv: megatron.core alone takes ~6 s to import here; the deadline cuts it."""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "verl_bridge.doctor", "--json"], capture_output=True, text=True,
                          timeout=60)
    elapsed = time.monotonic() - t0
    assert proc.returncode in (0, 1), proc.stderr
    assert elapsed < 6.0, elapsed  # 3.5 s probe deadline + start-up, with slack for a loaded 2-core box
    assert '"checks"' in proc.stdout


def test_issue_report_is_redacted_markdown(fake: FakeEnv):
    fake.healthy()
    home = os.path.expanduser("~")
    fake.file("megatron/core/__init__.py", f"raise ImportError('broken at {home}/secret token=abc123')\n")
    run = fake.run("--issue")
    assert run.rc == 1
    assert "| check | status | summary |" in run.out and "| megatron-core | " in run.out
    assert home + "/" not in run.out and "abc123" not in run.out
    user = getpass.getuser()
    if len(user) > 2:
        assert f"/{user}/" not in run.out


def test_verbose_text_shows_evidence_and_fix(fake: FakeEnv):
    fake.healthy()
    fake.dist("nvidia-nccl-cu11", "2.14.3")
    run = fake.run("-v")
    assert run.rc == 1
    assert "✗ nccl" in run.out and "    fix: pip uninstall -y" in run.out
    assert "    · dist: nvidia-nccl-cu11 2.14.3" in run.out


def test_console_script_runs_doctor():
    script = os.path.join(os.path.dirname(sys.executable), "verl-bridge")
    proc = subprocess.run([script, "doctor", "--explain", "-", "--json"], input="No module named 'amp_C'\n",
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and '"apex-no-cuda-ext"' in proc.stdout


def test_usage_error_exits_2(fake: FakeEnv):
    run = fake.run("--no-such-option")
    assert run.rc == 2
