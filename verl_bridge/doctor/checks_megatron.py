"""Checks ``megatron-namespace``, ``megatron-core`` and ``megatron-training``.

megatron-core installs ``megatron/core`` into the ``megatron`` *namespace* package (no
``megatron/__init__.py``), which Megatron-LM checkouts also contribute to. A regular
``megatron`` package anywhere earlier on sys.path hides all of it.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import dists, env
from .context import MCORE_FIX, Context
from .dists import SUPPORTED_MCORE
from .explain import explain
from .result import ERROR, OK, WARN, CheckResult, Findings


def _portion_contents(path: str) -> str:
    parts = [name for name in ("core", "training", "legacy") if os.path.isdir(os.path.join(path, name))]
    return ", ".join(f"megatron.{p}" for p in parts) or "no megatron.core / megatron.training"


def _owner_of(path: str, ctx: Context) -> str | None:
    """Which distribution (from its RECORD) or checkout put a ``megatron`` package there."""
    d = _init_owner(ctx, os.path.join(path, "__init__.py"))
    if d is not None:
        return f"{d.name} {d.version}"
    parent = str(Path(path).parent)
    if any(os.path.exists(os.path.join(parent, marker)) for marker in ("pretrain_gpt.py", ".git", "setup.py")):
        return f"a Megatron-LM checkout at {parent}"
    return None


def _init_owner(ctx: Context, init: str) -> env.Dist | None:
    """The distribution that installed ``megatron/__init__.py``: from RECORD, else a
    ``megatron`` distribution (the unrelated PyPI project) installed in the same directory."""
    if not os.path.exists(init):
        return None
    d = ctx.dists.owner_of(init)
    if d is not None:
        return d
    site = os.path.realpath(os.path.dirname(os.path.dirname(init)))
    for cand in ctx.dists.all("megatron"):
        if os.path.realpath(cand.site()) == site:
            return cand
    return None


def namespace_fix(ctx: Context) -> str:
    """What makes ``megatron`` the namespace package again, naming distributions only."""
    loc = ctx.megatron
    core = ctx.dists.get("megatron-core")
    restore = dists.reinstall(core) if core is not None else MCORE_FIX
    if loc.found and not loc.namespace and loc.origin:
        owner = _init_owner(ctx, loc.origin)
        if owner is not None and env.normalize(owner.name) != "megatron-core":
            return f"pip uninstall -y {owner.name} && {restore}"
        pkg_dir = os.path.dirname(loc.origin)
        if ctx.cwd_shadow("megatron"):
            return f"cd to another directory: {pkg_dir} in the current directory shadows the installed megatron"
        parent = os.path.dirname(pkg_dir)
        return (f"remove {parent} from PYTHONPATH (it holds the old Megatron-LM layout with megatron/__init__.py), "
                f"then: {restore}")
    return restore


def shadowed(ctx: Context) -> bool:
    return ctx.megatron.found and not ctx.megatron.namespace


def check_namespace(ctx: Context) -> CheckResult:
    f = Findings("megatron-namespace")
    loc = ctx.megatron
    if loc.error:
        f.add(ERROR, f"resolving `megatron` failed: {loc.error}", MCORE_FIX)
        return f.result("")
    if not loc.found:
        return CheckResult("megatron-namespace", OK, "no `megatron` package on sys.path (see megatron-core)")
    for p in loc.locations:
        f.note(f"portion: {p} ({_portion_contents(p)})")
    if not loc.namespace:
        pkg_dir = str(Path(loc.origin).parent) if loc.origin else "?"
        owner = _owner_of(pkg_dir, ctx) or "an unknown install"
        f.note(f"megatron resolves to {loc.origin}")
        d = _init_owner(ctx, loc.origin) if loc.origin else None
        what = owner
        if d is not None and env.normalize(d.name) == "megatron":
            what = f"the unrelated PyPI package `megatron` {d.version}"
        cwd = ctx.cwd_shadow("megatron")
        where = f" (the current directory {cwd}: `python` run from here imports it)" if cwd else ""
        f.add(ERROR, f"`megatron` at {pkg_dir}{where} is a regular package (it has __init__.py) from {what}; it "
                     "shadows the megatron namespace package that megatron-core installs into", namespace_fix(ctx))
        return f.result("")
    if len(loc.locations) > 1:
        where = "; ".join(f"{p} ({_portion_contents(p)})" for p in loc.locations)
        cores = [p for p in loc.locations if os.path.isdir(os.path.join(p, "core"))]
        if len(cores) > 1:
            where += f"; megatron.core is taken from {cores[0]} (the first), the copy in {', '.join(cores[1:])} is unused"
        # a Megatron-LM checkout on PYTHONPATH next to the megatron-core wheel is the usual setup;
        # whether the two megatron.core copies agree is the megatron-core check's question
        f.note(f"megatron is split over {len(loc.locations)} directories: {where}")
        return f.result(f"namespace package over {len(loc.locations)} directories: {where}")
    return f.result(f"namespace package at {loc.locations[0]} ({_portion_contents(loc.locations[0])})")


def check_core(ctx: Context) -> CheckResult:
    f = Findings("megatron-core")
    dist = ctx.dists.get("megatron-core")
    core_path = ctx.megatron_sub("core")
    core_dir = None
    if core_path:
        core_dir = core_path if os.path.isdir(core_path) else os.path.dirname(core_path)
    if shadowed(ctx):
        # the namespace check names the cause; its fix is the only one (no chasing of the
        # shadowing package's own missing dependencies)
        f.add(ERROR, f"`import megatron.core` cannot work while {ctx.megatron.origin} shadows the megatron namespace "
                     "(see megatron-namespace)", namespace_fix(ctx))
        return f.result("")
    if dist is None and core_dir is None:
        f.add(ERROR, "megatron-core is not installed", MCORE_FIX)
        return f.result("")
    if dist is not None:
        f.note(f"dist: megatron-core {dist.version} at {dist.location}")
        if env.satisfies(dist.version, SUPPORTED_MCORE) is False:
            f.add(ERROR, f"megatron-core {dist.version} is outside the supported range {SUPPORTED_MCORE}", MCORE_FIX)
        gone = dist.missing_files()
        if gone:
            listing = ", ".join(gone[:3]) + (f" and {len(gone) - 3} more" if len(gone) > 3 else "")
            f.add(ERROR, f"megatron-core {dist.version} is incomplete: {len(gone)} file(s) listed in its RECORD are "
                         f"missing ({listing})", dists.reinstall(dist))
    else:
        f.add(WARN, f"megatron.core at {core_dir} has no megatron-core distribution metadata "
                    "(a checkout on PYTHONPATH); its version cannot be managed by pip", MCORE_FIX)
    if core_dir is None:
        f.add(ERROR, "the megatron-core distribution is installed but its files (megatron/core) are missing",
              dists.reinstall(dist) if dist is not None else MCORE_FIX)
        return f.result("")
    f.note(f"megatron.core resolves to {core_dir}")
    info = os.path.join(core_dir, "package_info.py")
    file_version = env.read_package_version(info) if os.path.exists(info) else None
    if file_version:
        f.note(f"package_info.__version__ = {file_version}")
        if env.satisfies(file_version, SUPPORTED_MCORE) is False and (dist is None or not env.same_release(dist.version, file_version)):
            f.add(ERROR, f"megatron.core at {core_dir} is version {file_version}, outside the supported range "
                         f"{SUPPORTED_MCORE}", MCORE_FIX)
    if dist is not None and file_version and not env.same_release(dist.version, file_version):
        if env.vtuple(dist.version)[:2] == env.vtuple(file_version)[:2]:
            checkout = str(Path(core_dir).parent.parent)
            f.add(WARN, f"megatron.core is imported from {core_dir} ({file_version}) while the megatron-core wheel is "
                        f"{dist.version}: a patch-level difference on the same release line, not a clash",
                  f"none required; to make them identical: git -C {checkout} checkout core_v{dist.version}")
        else:
            f.add(ERROR, f"metadata says megatron-core {dist.version} but megatron/core/package_info.py at {core_dir} "
                         f"says {file_version}: another copy of megatron.core shadows the installed one",
                  f"remove the other copy ({Path(core_dir).parent.parent}) from PYTHONPATH")
    elif dist is not None and not _same_tree(dist.location, core_dir) and not file_version:
        f.add(ERROR, f"megatron-core {dist.version} is installed in {dist.location} but megatron.core is imported from "
                     f"{core_dir}", "remove the other megatron checkout from PYTHONPATH")
    if dist is not None and env.satisfies(dist.version, SUPPORTED_MCORE) is not False:
        _own_requirements(ctx, f, dist)  # (an unsupported release is replaced, not repaired)
    if not any(p[0] == ERROR for p in f.problems):
        _import_result(ctx, f, "megatron-core", "megatron.core", required=True)
    step = ctx.step("megatron-core", "megatron.core")
    if step is not None and step.ok:
        v = step.data.get("version")
        file = step.data.get("file")
        if file:
            f.note(f"imported from {file}")
        if v and file_version and not env.same_release(v, file_version):
            f.add(ERROR, f"import reports version {v} but package_info.py says {file_version}", MCORE_FIX)
    version = (dist.version if dist else file_version) or "?"
    return f.result(f"{version} (supported {SUPPORTED_MCORE}) at {core_dir}")


def _own_requirements(ctx: Context, f: Findings, dist: env.Dist) -> None:
    """megatron-core's own Requires-Dist (numpy, packaging, ...; torch is the torch check's). A
    requirement that another installed package contradicts is only noted: a fix for one would
    break the other (an advice loop), so the summary names both instead."""
    for req in dists.active_requires(dist.requires):
        dep = dists.requirement_name(req)
        if env.normalize(dep) == "torch":
            continue
        have = ctx.dists.get(dep)
        specs = env.requirement_pins([req], dep)
        if have is None:
            f.add(ERROR, f"megatron-core {dist.version} needs {req}, which is not installed", f'pip install "{req}"')
            continue
        for spec in specs:
            if env.satisfies(have.version, spec) is not False:
                continue
            others = [f"{o.name} {o.version} requires {dep}{s}" for key in sorted(ctx.dists.by_name)
                      for o in ctx.dists.by_name[key][:1] if env.normalize(o.name) != "megatron-core"
                      for s in env.requirement_pins(dists.active_requires(o.requires), dep)
                      if env.satisfies(have.version, s) is not False and s != spec]
            if others:
                f.add(ERROR, f"megatron-core {dist.version} requires {dep}{spec} but {dep} {have.version} is installed, "
                             f"and {'; '.join(others[:2])}: these two cannot both be satisfied",
                      f'pip install "megatron-core{SUPPORTED_MCORE}"  # pip picks a supported megatron-core '
                      f"release that accepts {dep} {have.version}")
            else:
                f.add(ERROR, f"megatron-core {dist.version} requires {dep}{spec} but {dep} {have.version} is installed",
                      f'pip install "{dep}{spec}"')


def _same_tree(location: str, core_dir: str) -> bool:
    loc = os.path.realpath(location)
    core = os.path.realpath(core_dir)
    if core.startswith(loc + os.sep):
        return True
    # editable installs keep metadata elsewhere: a .dist-info next to site-packages is fine
    return os.path.dirname(loc) == os.path.dirname(os.path.dirname(core))


def _import_result(ctx: Context, f: Findings, probe: str, step_name: str, fix: str = MCORE_FIX,
                   required: bool = False) -> None:
    step = ctx.step(probe, step_name)
    if step is None:
        return
    if step.status == "timeout":
        f.unknown(f"`import {step_name}` did not finish within {ctx.timeout:g} s, so it is not verified "
                  "(status unknown)", f"verl-bridge doctor --timeout {max(120, int(ctx.timeout * 2))}",
                  required=required)
        return
    if step.ok or step.status == "not-run":
        return
    text = f"{step.error}\n{step.traceback}"
    f.note(f"import {step_name}: {step.error}")
    cause = root_cause(ctx, text)
    if cause is not None:
        f.add(ERROR, f"`import {step_name}` fails: {step.error.splitlines()[0][:300]} ({cause[0]})", cause[1])
        return
    matches = explain(text, install=lambda mod: dists.install_fix(mod, ctx.dists, ctx.dists.version("megatron-core")))
    if matches:
        m = matches[0]
        f.add(ERROR, f"`import {step_name}` fails: {step.error.splitlines()[0][:300]} ({m.cause})", m.fix)
    else:
        f.add(ERROR, f"`import {step_name}` fails: {step.describe()[:300]}", fix)


def root_cause(ctx: Context, text: str) -> tuple[str, str] | None:
    """A failure that another check explains better: a broken torch, or an empty leftover
    package directory that the import picked up. (cause, the other check's fix)."""
    from .checks_native import leftover_fix, torch_fix

    torch_step = ctx.step("torch", "torch")
    if torch_step is not None and torch_step.status in ("error", "crash"):
        return ("torch itself does not import; see the torch check", torch_fix(ctx))
    for name in LEFTOVER_CANDIDATES:
        path = env.leftover_dir(ctx.top(name))
        if path and (name in text or name.replace("_", "-") in text):
            return (f"the empty directory {path} makes `import {name}` succeed as an empty namespace package; "
                    "see the check for it", leftover_fix(path))
    return None


LEFTOVER_CANDIDATES = ("transformer_engine", "apex", "flash_attn", "vllm", "torch", "megatron")


def check_training(ctx: Context) -> CheckResult:
    f = Findings("megatron-training")
    loc = ctx.megatron
    version = ctx.dists.version("megatron-core")
    clone = dists.megatron_lm_clone(version)
    if not loc.found:
        return CheckResult("megatron-training", OK, "not installed; only Megatron-LM scripts (pretrain_gpt.py, "
                           "get_args) need it, verl-bridge does not")
    if not loc.namespace:
        f.add(WARN, f"megatron.training cannot be resolved while {loc.origin} shadows the namespace "
                    "(see megatron-namespace)", namespace_fix(ctx))
        return f.result("")
    training = ctx.megatron_sub("training")
    if not training:
        if version and env.vcmp(version, "0.17") >= 0:
            f.add(WARN, f"megatron.training is missing although megatron-core {version} ships it",
                  f'pip install --force-reinstall --no-deps "megatron-core=={version}"')
            return f.result("")
        return CheckResult("megatron-training", OK, "not installed; only Megatron-LM scripts (pretrain_gpt.py, "
                           f"get_args, initialize_megatron) need it, verl-bridge does not (to add it: {clone})")
    f.note(f"megatron.training at {training}")
    if training.endswith(".py") and not training.endswith("__init__.py"):
        f.add(WARN, f"megatron.training is the single file {training} (the Megatron-LM layout before 2024); code for "
                    f"megatron-core {version or '?'} expects the megatron/training/ package", clone)
        return f.result("")
    step = ctx.step("megatron-training", "megatron.training")
    if step is not None and step.ok and step.data.get("get_args") is False:
        f.add(WARN, "megatron.training imports but has no global_vars.get_args: not the Megatron-LM layout that "
                    f"megatron-core {version or '?'} goes with", clone)
    elif step is not None:
        _import_result(ctx, f, "megatron-training", "megatron.training", fix=clone)
        f.problems = [(WARN if s == ERROR else s, m, x) for s, m, x in f.problems]
    where = os.path.dirname(training) if training.endswith("__init__.py") else training
    return f.result(f"megatron.training at {where} (imports)")
