"""Static facts about the environment, read without importing the packages they describe.

Versions come from ``importlib.metadata``; module locations from ``importlib.util.find_spec``
for top-level names only (a submodule lookup would execute the parent package) and from the
file system below the parent's search locations.
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata as md
import importlib.util
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

_SUFFIXES = tuple(importlib.machinery.EXTENSION_SUFFIXES) + (".py", ".pyc")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def vtuple(version: str | None) -> tuple[int, ...]:
    """Release numbers of a version string: '2.7.4.post1+cu12' -> (2, 7, 4)."""
    if not version:
        return ()
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    if not m:
        return ()
    return tuple(int(x) for x in m.group(1).split("."))


def vcmp(a: str | tuple, b: str | tuple) -> int:
    ta = vtuple(a) if isinstance(a, str) else a
    tb = vtuple(b) if isinstance(b, str) else b
    n = max(len(ta), len(tb))
    ta, tb = ta + (0,) * (n - len(ta)), tb + (0,) * (n - len(tb))
    return (ta > tb) - (ta < tb)


def same_release(a: str | None, b: str | None) -> bool:
    """'2.5.1+cu124' and '2.5.1' are the same release; local labels are compared elsewhere."""
    return bool(a and b) and vcmp(a, b) == 0


@dataclass
class Dist:
    name: str
    version: str
    location: str
    requires: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)


class DistIndex:
    """Every installed distribution, grouped by normalized name, in sys.path order."""

    def __init__(self, path: list[str] | None = None) -> None:
        self.by_name: dict[str, list[Dist]] = {}
        for dist in md.distributions(path=path if path is not None else sys.path):
            try:
                name = dist.metadata["Name"]
                if not name:
                    continue
                loc = str(getattr(dist, "_path", "") or dist.locate_file(""))
                self.by_name.setdefault(normalize(name), []).append(
                    Dist(name, dist.version or "", loc, list(dist.requires or []), [])
                )
            except Exception:  # a broken METADATA must not break the doctor
                continue

    def get(self, name: str) -> Dist | None:
        found = self.by_name.get(normalize(name))
        return found[0] if found else None

    def all(self, name: str) -> list[Dist]:
        return list(self.by_name.get(normalize(name), []))

    def version(self, name: str) -> str | None:
        d = self.get(name)
        return d.version if d else None

    def matching(self, pattern: str) -> list[Dist]:
        rx = re.compile(pattern)
        out: list[Dist] = []
        for key, dists in sorted(self.by_name.items()):
            if rx.fullmatch(key):
                out.extend(dists)
        return out


def requirement_pins(requires: list[str], package: str) -> list[str]:
    """Version specifiers that ``requires`` puts on ``package`` (environment markers dropped).

    ``['torch==2.5.1', 'xformers; extra == "x"']`` -> ``['==2.5.1']`` for package ``torch``.
    """
    pins: list[str] = []
    for req in requires:
        body, _, marker = req.partition(";")
        if "extra" in marker:
            continue
        m = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*(?:\[[^\]]*\])?\s*\(?([^)]*)\)?", body)
        if m and normalize(m.group(1)) == normalize(package):
            spec = m.group(2).strip()
            if spec:
                pins.append(spec.replace(" ", ""))
    return pins


def satisfies(version: str, spec: str) -> bool | None:
    """Whether ``version`` meets a comma-separated specifier; None when it cannot tell."""
    ok = True
    for part in filter(None, spec.split(",")):
        m = re.match(r"(===|==|!=|>=|<=|~=|>|<)\s*(.+)", part.strip())
        if not m:
            return None
        op, target = m.groups()
        if "*" in target:  # ==2.5.* : compare the given prefix
            prefix = vtuple(target.replace(".*", ""))
            cmp_eq = vtuple(version)[: len(prefix)] == prefix
            ok &= cmp_eq if op == "==" else (not cmp_eq if op == "!=" else True)
            continue
        c = vcmp(version, target)
        if op in ("==", "==="):
            ok &= c == 0
        elif op == "!=":
            ok &= c != 0
        elif op == ">=":
            ok &= c >= 0
        elif op == "<=":
            ok &= c <= 0
        elif op == ">":
            ok &= c > 0
        elif op == "<":
            ok &= c < 0
        elif op == "~=":
            t = vtuple(target)
            ok &= c >= 0 and vtuple(version)[: len(t) - 1] == t[:-1]
    return ok


@dataclass
class ModuleLoc:
    """Where a top-level module resolves, without executing it."""

    name: str
    found: bool
    origin: str | None = None  # file for a regular package/module; None for a namespace
    locations: list[str] = field(default_factory=list)  # package search locations
    namespace: bool = False
    error: str | None = None


def find_top(name: str) -> ModuleLoc:
    try:
        spec = importlib.util.find_spec(name)
    except Exception as exc:  # find_spec of a top-level name does not execute it, but be safe
        return ModuleLoc(name, False, error=f"{type(exc).__name__}: {exc}")
    if spec is None:
        return ModuleLoc(name, False)
    locs = [str(p) for p in (spec.submodule_search_locations or [])]
    origin = spec.origin if spec.origin not in (None, "namespace") else None
    namespace = spec.submodule_search_locations is not None and origin is None
    return ModuleLoc(name, True, origin, locs, namespace)


def find_sub(locations: list[str], dotted: str) -> str | None:
    """Path of submodule ``dotted`` ('core.package_info') below package directories.

    Returns a file (module, extension or package ``__init__``) or a directory (namespace
    portion); None when it is absent from every location.
    """
    parts = dotted.split(".")
    for base in locations:
        cur = [Path(base)]
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            nxt: list[Path] = []
            for d in cur:
                pkg = d / part
                if pkg.is_dir():
                    if last:
                        init = pkg / "__init__.py"
                        return str(init if init.exists() else pkg)
                    nxt.append(pkg)
                elif last:
                    hit = module_file(d, part)
                    if hit:
                        return hit
            cur = nxt
            if not cur:
                break
    return None


def module_file(directory: Path, name: str) -> str | None:
    """A module file ``name.py`` or extension ``name.cpython-311-...so`` in ``directory``."""
    try:
        entries = os.listdir(directory)
    except OSError:
        return None
    for entry in sorted(entries):
        if entry == name + ".py":
            return str(directory / entry)
    for entry in sorted(entries):
        if entry.startswith(name + ".") and entry.endswith(_SUFFIXES) and entry != name + ".pyc":
            return str(directory / entry)
    return None


def read_package_version(package_info: str) -> str | None:
    """``__version__`` of megatron.core's package_info.py, read with ast (never executed)."""
    import ast

    try:
        tree = ast.parse(Path(package_info).read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return None
    consts: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                consts[node.targets[0].id] = ast.literal_eval(node.value)
            except Exception:
                continue
    if isinstance(consts.get("__version__"), str):
        return consts["__version__"]  # type: ignore[return-value]
    if all(k in consts for k in ("MAJOR", "MINOR", "PATCH")):
        pre = consts.get("PRE_RELEASE") or ""
        return f"{consts['MAJOR']}.{consts['MINOR']}.{consts['PATCH']}{pre}"
    return None


def library_dirs() -> list[str]:
    """Directories the dynamic loader may search: LD_LIBRARY_PATH then common system dirs."""
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/local/cuda/lib64", "/usr/local/nccl/lib"):
        if d not in dirs:
            dirs.append(d)
    return dirs
