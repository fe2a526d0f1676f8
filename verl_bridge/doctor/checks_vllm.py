"""Check ``vllm``: its exact torch pin, and whether its compiled ops (vllm._C) load."""

from __future__ import annotations

from . import env
from .checks_native import failed_import, torch_version
from .context import Context
from .result import ERROR, OK, WARN, CheckResult, Findings

VLLM_EXTRA = 'pip install "verl-bridge[vllm]"'


def check_vllm(ctx: Context) -> CheckResult:
    f = Findings("vllm")
    dist = ctx.dists.get("vllm")
    loc = ctx.top("vllm")
    if dist is None and not loc.found:
        return CheckResult("vllm", OK, f"not installed (optional, for rollout.engine: vllm: {VLLM_EXTRA})")
    if dist is None:
        f.add(WARN, f"vllm at {loc.origin or loc.locations} has no distribution metadata (a source checkout?)",
              VLLM_EXTRA)
        version = None
    else:
        version = dist.version
        f.note(f"dist: vllm {dist.version} at {dist.location}")
        if env.vcmp(dist.version, "0.8") < 0:
            f.add(WARN, f"vllm {dist.version} is older than verl-bridge supports (>=0.8)", VLLM_EXTRA)
    tv = torch_version(ctx)
    pins = env.requirement_pins(dist.requires, "torch") if dist else []
    if pins:
        f.note(f"vllm requires torch{','.join(pins)}; installed torch {tv or 'none'}")
    for spec in pins:
        if not tv:
            f.add(ERROR, f"vllm {version} requires torch{spec} but torch is not installed", f'pip install "torch{spec}"')
        elif env.satisfies(tv, spec) is False:
            f.add(ERROR, f"vllm {version} is built for torch{spec} but torch {tv} is installed; its compiled ops only "
                         "load with the torch it was built for",
                  f'pip install "torch{spec}"  # or: pip install "vllm" built for torch {tv}')
    if not loc.found:
        f.add(ERROR, "the vllm distribution is installed but the `vllm` package is missing",
              f'pip install --force-reinstall "vllm=={version}"')
        return f.result("")
    failed_import(ctx, f, ctx.step("vllm", "vllm._C"), "vLLM's compiled ops do not load",
                  f'pip install --force-reinstall "vllm{"==" + version if version else ""}"  # reinstalls the torch it pins')
    return f.result(f"{version or '?'} (torch {tv or '?'})")
