"""Checks ``megatron-namespace``, ``megatron-core`` and ``megatron-training``.

megatron-core installs ``megatron/core`` into the ``megatron`` *namespace* package (no
``megatron/__init__.py``), which Megatron-LM checkouts also contribute to. A regular
``megatron`` package anywhere earlier on sys.path hides all of it.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import env
from .context import MCORE_FIX, SUPPORTED_MCORE, Context
from .explain import explain
from .result import ERROR, OK, WARN, CheckResult, Findings


def _portion_contents(path: str) -> str:
    parts = [name for name in ("core", "training", "legacy") if os.path.isdir(os.path.join(path, name))]
    return ", ".join(f"megatron.{p}" for p in parts) or "no megatron.core / megatron.training"


def _owner_of(path: str, ctx: Context) -> str | None:
    """Which distribution or checkout put a ``megatron`` directory there."""
    parent = str(Path(path).parent)
    for name in ("megatron", "megatron-lm", "megatron-core"):
        for d in ctx.dists.all(name):
            if os.path.realpath(d.location).startswith(os.path.realpath(parent)) or \
                    os.path.realpath(os.path.dirname(d.location)) == os.path.realpath(parent):
                return f"{d.name} {d.version}"
    if any(os.path.exists(os.path.join(parent, marker)) for marker in ("pretrain_gpt.py", ".git", "setup.py")):
        return f"a Megatron-LM checkout at {parent}"
    return None


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
        pypi = ctx.dists.get("megatron")
        if pypi is not None:
            fix = f'pip uninstall -y megatron && pip install --force-reinstall --no-deps "megatron-core{SUPPORTED_MCORE}"'
            what = f"the unrelated PyPI package `megatron` {pypi.version}"
        else:
            parent = str(Path(pkg_dir).parent)
            fix = (f"remove {parent} from PYTHONPATH (or delete {loc.origin}), then: "
                   f'pip install --force-reinstall --no-deps "megatron-core{SUPPORTED_MCORE}"')
            what = owner
        f.add(ERROR, f"`megatron` at {pkg_dir} is a regular package (it has __init__.py) from {what}; it shadows "
                     "the megatron namespace package that megatron-core installs into", fix)
        return f.result("")
    if len(loc.locations) > 1:
        where = "; ".join(f"{p} ({_portion_contents(p)})" for p in loc.locations)
        cores = [p for p in loc.locations if os.path.isdir(os.path.join(p, "core"))]
        extra = ""
        if len(cores) > 1:
            extra = f"; megatron.core is taken from {cores[0]}, the copy in {', '.join(cores[1:])} is ignored"
        keep = loc.locations[-1]
        f.add(WARN, f"`megatron` is split over {len(loc.locations)} directories: {where}{extra}",
              "keep one source of megatron: drop the checkout from PYTHONPATH "
              f"(export PYTHONPATH=<without {Path(loc.locations[0]).parent}>) or uninstall the wheel "
              f"(pip uninstall -y megatron-core) and use only the checkout; the portion kept would be {keep}")
        return f.result("")
    return f.result(f"namespace package at {loc.locations[0]} ({_portion_contents(loc.locations[0])})")


def check_core(ctx: Context) -> CheckResult:
    f = Findings("megatron-core")
    dist = ctx.dists.get("megatron-core")
    core_path = ctx.megatron_sub("core")
    core_dir = None
    if core_path:
        core_dir = core_path if os.path.isdir(core_path) else os.path.dirname(core_path)
    if dist is None and core_dir is None:
        f.add(ERROR, "megatron-core is not installed", MCORE_FIX)
        return f.result("")
    if dist is not None:
        f.note(f"dist: megatron-core {dist.version} at {dist.location}")
        if env.satisfies(dist.version, SUPPORTED_MCORE) is False:
            f.add(ERROR, f"megatron-core {dist.version} is outside the supported range {SUPPORTED_MCORE}", MCORE_FIX)
    else:
        f.add(WARN, f"megatron.core at {core_dir} has no megatron-core distribution metadata "
                    "(a checkout on PYTHONPATH); its version cannot be managed by pip", MCORE_FIX)
    if core_dir is None:
        if ctx.megatron.found and not ctx.megatron.namespace:
            f.add(ERROR, "megatron-core is installed but `megatron.core` is hidden by the regular package "
                         f"{ctx.megatron.origin} (see megatron-namespace)",
                  f'pip install --force-reinstall --no-deps "megatron-core{SUPPORTED_MCORE}"')
        else:
            f.add(ERROR, "the megatron-core distribution is installed but its files (megatron/core) are missing",
                  f'pip install --force-reinstall --no-deps "megatron-core{SUPPORTED_MCORE}"')
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
        f.add(ERROR, f"metadata says megatron-core {dist.version} but megatron/core/package_info.py at {core_dir} says "
                     f"{file_version}: another copy of megatron.core shadows the installed one",
              f"remove the other copy from PYTHONPATH, then: pip install --force-reinstall --no-deps \"megatron-core=={dist.version}\"")
    elif dist is not None and not _same_tree(dist.location, core_dir):
        f.add(ERROR, f"megatron-core {dist.version} is installed in {dist.location} but megatron.core is imported from "
                     f"{core_dir}", "remove the other megatron checkout from PYTHONPATH")
    _import_result(ctx, f, "megatron-core", "megatron.core")
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


def _same_tree(location: str, core_dir: str) -> bool:
    loc = os.path.realpath(location)
    core = os.path.realpath(core_dir)
    if core.startswith(loc + os.sep):
        return True
    # editable installs keep metadata elsewhere: a .dist-info next to site-packages is fine
    return os.path.dirname(loc) == os.path.dirname(os.path.dirname(core))


def _import_result(ctx: Context, f: Findings, probe: str, step_name: str, fix: str = MCORE_FIX) -> None:
    step = ctx.step(probe, step_name)
    if step is None:
        return
    if step.status == "timeout":
        f.add(WARN, f"`import {step_name}` did not finish within {ctx.timeout:g} s, so it was not verified",
              f"verl-bridge doctor --timeout 60  # to wait for the import")
        return
    if step.ok or step.status == "not-run":
        return
    text = f"{step.error}\n{step.traceback}"
    matches = explain(text)
    f.note(f"import {step_name}: {step.error}")
    if matches:
        m = matches[0]
        f.add(ERROR, f"`import {step_name}` fails: {step.error.splitlines()[0][:300]} ({m.cause})", m.fix)
    else:
        f.add(ERROR, f"`import {step_name}` fails: {step.describe()[:300]}", fix)


def check_training(ctx: Context) -> CheckResult:
    f = Findings("megatron-training")
    loc = ctx.megatron
    dist = ctx.dists.get("megatron-core")
    version = dist.version if dist else None
    branch = "core_r{}.{}.0".format(*env.vtuple(version)[:2]) if version and len(env.vtuple(version)) >= 2 else "main"
    checkout_fix = (f"git clone --branch {branch} https://github.com/NVIDIA/Megatron-LM && "
                    "export PYTHONPATH=$PWD/Megatron-LM:$PYTHONPATH")
    if not loc.found:
        f.add(WARN, "megatron.training is not available (megatron is not installed)", checkout_fix)
        return f.result("")
    if not loc.namespace:
        f.add(WARN, f"megatron.training cannot be resolved while {loc.origin} shadows the namespace "
                    "(see megatron-namespace)", checkout_fix)
        return f.result("")
    training = ctx.megatron_sub("training")
    if training:
        f.note(f"megatron.training at {training}")
        return f.result(f"megatron.training at {os.path.dirname(training) if training.endswith('.py') else training}")
    if version and env.vcmp(version, "0.17") >= 0:
        f.add(WARN, f"megatron.training is missing although megatron-core {version} ships it",
              f'pip install --force-reinstall --no-deps "megatron-core=={version}"')
    else:
        f.add(WARN, "megatron.training is not installed: the megatron-core wheel before 0.17 does not ship it; "
                    "Megatron-LM scripts (pretrain_gpt.py, get_args, initialize_megatron) need a Megatron-LM "
                    "checkout on PYTHONPATH (verl-bridge itself does not)", checkout_fix)
    return f.result("")
