"""Run every check: start the probes, read the static facts while they run, then judge.

A check that raises is reported as an ``error`` result of that check; it never stops the others.
"""

from __future__ import annotations

import time
import traceback

from . import CHECK_IDS, checks_bridge, checks_megatron, checks_native, checks_vllm
from .context import Context
from .probe import run_probes
from .result import ERROR, CheckResult

CHECKS = {
    "python": checks_bridge.check_python,
    "torch": checks_native.check_torch,
    "megatron-core": checks_megatron.check_core,
    "megatron-namespace": checks_megatron.check_namespace,
    "megatron-training": checks_megatron.check_training,
    "transformer-engine": checks_native.check_te,
    "apex": checks_native.check_apex,
    "flash-attn": checks_native.check_flash_attn,
    "vllm": checks_vllm.check_vllm,
    "nccl": checks_native.check_nccl,
    "verl-bridge": checks_bridge.check_bridge,
}
assert tuple(CHECKS) == CHECK_IDS


def run_checks(config_path: str | None = None, timeout: float = 4.0) -> tuple[list[CheckResult], float]:
    t0 = time.monotonic()
    ctx = Context(config_path=config_path, timeout=timeout)
    try:
        probes = ctx.plan_probes()
    except Exception:  # planning reads only metadata; if even that fails, run without probes
        probes = []
    ctx.probes = {p.name: p for p in probes}
    for p in probes:
        p.start()
    try:
        _ = ctx.dists  # read all metadata while the probes import
    except Exception:
        pass
    deadline = t0 + timeout
    for p in probes:
        p.finish(deadline)
    results: list[CheckResult] = []
    for cid, fn in CHECKS.items():
        try:
            results.append(fn(ctx))
        except Exception as exc:
            tb = traceback.format_exc().strip().splitlines()[-3:]
            results.append(CheckResult(cid, ERROR, f"the {cid} check itself failed: {type(exc).__name__}: {exc}",
                                       "please report this with: verl-bridge doctor --issue", tb))
    return results, time.monotonic() - t0


__all__ = ["run_checks", "run_probes", "CHECKS"]
