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


def progress_line(stream=None):
    """A ``progress(waiting, elapsed)`` callback: a rewritten line on a terminal; elsewhere one
    line after 10 s (so CI logs show why the doctor waits) and nothing more."""
    import sys

    stream = stream or sys.stderr
    tty = hasattr(stream, "isatty") and stream.isatty()
    said = {"plain": False, "tty": False}

    def show(waiting: list[str], elapsed: float) -> None:
        if not waiting:
            return
        text = f"verl-bridge doctor: waiting for `import {', '.join(waiting)}` ({elapsed:.0f} s)"
        if tty:
            stream.write("\r" + text + "\033[K")
            said["tty"] = True
            stream.flush()
        elif elapsed >= 10 and not said["plain"]:
            stream.write(text + " ...\n")
            said["plain"] = True
            stream.flush()

    def done() -> None:
        if said["tty"]:
            stream.write("\r\033[K")
            stream.flush()

    show.done = done  # type: ignore[attr-defined]
    return show


def run_checks(config_path: str | None = None, timeout: float = 60.0,
               progress=None) -> tuple[list[CheckResult], float]:
    t0 = time.monotonic()
    ctx = Context(config_path=config_path, timeout=timeout)
    try:
        probes = ctx.plan_probes()
    except Exception:  # planning reads only metadata; if even that fails, run without probes
        probes = []
    ctx.probes = {p.name: p for p in probes}
    run_probes(probes, max(0.0, timeout - (time.monotonic() - t0)), cwd=ctx.cwd, progress=progress)
    if progress is not None and hasattr(progress, "done"):
        progress.done()
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
