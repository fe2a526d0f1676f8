"""The vLLM tier: every test here needs vLLM installed (run by .ci/vllm_tier.sh in its own venv).

Without an importable ``vllm`` each test of this directory is marked ``vllm`` and skipped with
the reason, except modules that declare ``NEEDS_VLLM = False`` (pure-Python tests of the
adapter's version gate, which run in the main environment too).
"""

from __future__ import annotations

import importlib.util

import pytest


def _vllm_missing_reason():
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed in this environment (the vLLM tier runs via .ci/vllm_tier.sh)"
    try:
        import vllm  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure means the tier cannot run here
        return f"vLLM is installed but `import vllm` fails ({type(e).__name__}: {e})"
    return None


_REASON = _vllm_missing_reason()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/vllm/" not in str(item.fspath).replace("\\", "/"):
            continue
        if getattr(item.module, "NEEDS_VLLM", True):
            item.add_marker(pytest.mark.vllm)
            if _REASON:
                item.add_marker(pytest.mark.skip(reason=_REASON))
