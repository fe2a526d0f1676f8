"""The command itself: speed, --issue redaction, exit codes, no heavy imports."""

from __future__ import annotations

import getpass
import io
import json
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


def test_healthy_cpu_environment_passes_strict(tmp_path):
    """This machine's venv (torch 2.13 CPU, megatron-core 0.16.1, no Megatron-LM checkout): every
    probe finishes under the default deadline, every check is verified ok, and --strict passes.
    Run as the console script from another directory, as a user would."""
    script = os.path.join(os.path.dirname(sys.executable), "verl-bridge")
    t0 = time.monotonic()
    proc = subprocess.run([script, "doctor", "--json", "--strict"], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    elapsed = time.monotonic() - t0
    checks = {c["id"]: c for c in json.loads(proc.stdout)["checks"]}
    assert proc.returncode == 0, {k: c["summary"] for k, c in checks.items() if c["status"] != "ok"}
    assert all(c["status"] == "ok" and c["verified"] for c in checks.values())
    assert "not installed" in checks["megatron-training"]["summary"]
    assert elapsed < 60, elapsed


def test_progress_line_on_a_terminal_only_rewrites_one_line():
    from verl_bridge.doctor.runner import progress_line

    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty = Tty()
    show = progress_line(tty)
    show(["megatron-core", "torch"], 3.2)
    show(["megatron-core"], 4.2)
    show.done()
    assert "\rverl-bridge doctor: waiting for `import megatron-core, torch` (3 s)" in tty.getvalue()
    assert tty.getvalue().endswith("\r\033[K") and "\n" not in tty.getvalue()
    log = io.StringIO()
    show = progress_line(log)
    show(["megatron-core"], 2.0)
    assert log.getvalue() == ""  # a log file gets one line, and only when the wait is long
    show(["megatron-core"], 11.0)
    show(["megatron-core"], 12.0)
    assert log.getvalue().count("\n") == 1 and "waiting for `import megatron-core`" in log.getvalue()


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
