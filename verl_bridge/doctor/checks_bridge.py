"""Checks ``python`` and ``verl-bridge`` (its own install, its extras for the configured features,
and the seed article's import path)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from . import env
from .context import Context
from .result import ERROR, OK, WARN, CheckResult, Findings

SEED_IMPORT = "from verl.trainer.rl_trainer.megatron import MegatronTrainer"


def check_python(ctx: Context) -> CheckResult:
    f = Findings("python")
    v = sys.version_info
    version = f"{v[0]}.{v[1]}.{v[2]}"
    f.note(f"executable: {sys.executable}")
    f.note(f"prefix: {sys.prefix}" + (" (virtual environment)" if sys.prefix != sys.base_prefix else ""))
    pp = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    for p in pp:
        f.note(f"PYTHONPATH entry: {p}" + ("" if os.path.exists(p) else " (does not exist)"))
    if v < (3, 10):
        f.add(ERROR, f"Python {version} is too old: verl-bridge needs Python >= 3.10",
              "create an environment with Python 3.10-3.12, e.g. uv venv --python 3.12")
    mc = ctx.dists.version("megatron-core")
    if mc and env.vcmp(mc, "0.17") >= 0 and v < (3, 12):
        f.add(WARN, f"megatron-core {mc} needs Python >= 3.12 but this is {version}",
              "create an environment with Python 3.12, or: pip install \"megatron-core>=0.12,<0.17\"")
    return f.result(f"{version} ({sys.executable})")


def trainer_import() -> str:
    """Where this install defines MegatronTrainer, found by reading the package's files."""
    pkg = env.find_top("verl_bridge")
    root = Path(pkg.locations[0]) if pkg.locations else None
    if root is None:
        return "from verl_bridge import MegatronTrainer"
    init = root / "__init__.py"
    try:
        if "MegatronTrainer" in init.read_text(encoding="utf-8", errors="replace"):
            return "from verl_bridge import MegatronTrainer"
    except OSError:
        pass
    rx = re.compile(r"^class MegatronTrainer\b", re.M)
    for path in sorted(root.rglob("*.py")):
        if "doctor" in path.parts or "tests" in path.parts:
            continue
        try:
            if rx.search(path.read_text(encoding="utf-8", errors="replace")):
                mod = ".".join(path.relative_to(root.parent).with_suffix("").parts)
                return f"from {mod} import MegatronTrainer"
        except (OSError, ValueError):
            continue
    return "from verl_bridge import MegatronTrainer"


def read_engine(path: str) -> str | None:
    import yaml

    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh) or {}
    if not isinstance(data, dict):
        raise ValueError("the top level is not a mapping")
    rollout = data.get("rollout")
    if isinstance(rollout, dict) and rollout.get("engine") is not None:
        return str(rollout["engine"])
    if "rollout.engine" in data:
        return str(data["rollout.engine"])
    return None


def check_bridge(ctx: Context) -> CheckResult:
    f = Findings("verl-bridge")
    dist = ctx.dists.get("verl-bridge")
    loc = ctx.top("verl_bridge") if ctx else env.find_top("verl_bridge")
    if dist is None:
        f.add(WARN, "verl-bridge has no distribution metadata (running from a source tree?)", "pip install -e .")
    else:
        f.note(f"dist: verl-bridge {dist.version} at {dist.location}")
        for req in dist.requires:
            body, _, marker = req.partition(";")
            if "extra" in marker:
                continue
            m = re.match(r"\s*([A-Za-z0-9_.\-]+)", body)
            if not m:
                continue
            name = m.group(1)
            if name in ("torch", "megatron-core"):
                continue  # their own checks cover them
            have = ctx.dists.get(name)
            specs = env.requirement_pins([req], name)
            if have is None:
                f.add(ERROR, f"dependency {name} is not installed", f'pip install "{body.strip()}"')
            elif specs and env.satisfies(have.version, specs[0]) is False:
                f.add(ERROR, f"dependency {name} {have.version} does not satisfy {specs[0]}", f'pip install "{body.strip()}"')
    if loc.found:
        f.note(f"verl_bridge imported from {loc.origin or loc.locations}")
    ours = trainer_import()
    f.note(f"seed article: `{SEED_IMPORT}` -> here: `{ours}`")
    verl = ctx.top("verl")
    if verl.found:
        f.note(f"a separate `verl` package is installed at {verl.origin or verl.locations}; it is not verl-bridge")
    if ctx.config_path:
        f.note(f"config: {ctx.config_path}")
        try:
            engine = read_engine(ctx.config_path)
        except Exception as exc:  # a bad config is a finding, not a doctor failure
            f.add(ERROR, f"cannot read the config {ctx.config_path}: {type(exc).__name__}: {exc}",
                  f"verl-bridge validate {ctx.config_path}")
            engine = None
        f.note(f"rollout.engine = {engine or 'native (default)'}")
        if engine == "vllm" and not (ctx.dists.get("vllm") or ctx.top("vllm").found):
            f.add(ERROR, "the config sets rollout.engine: vllm but vLLM is not installed",
                  'pip install "verl-bridge[vllm]"')
        elif engine not in (None, "native", "vllm"):
            f.add(ERROR, f"rollout.engine={engine!r} is not one of native, vllm", "set rollout.engine to native or vllm")
    version = dist.version if dist else "?"
    return f.result(f"{version}; the seed article's MegatronTrainer import is `{ours}` here")
