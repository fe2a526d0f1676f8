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
    location: str  # the directory holding the *.dist-info (or *.egg-info) folder
    requires: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)  # RECORD entries, relative to site (filled lazily)
    info_dir: str = ""
    top_level: list[str] = field(default_factory=list)  # import names this distribution provides

    def site(self) -> str:
        """The directory the RECORD paths are relative to."""
        return os.path.dirname(self.info_dir) if self.info_dir else self.location

    def missing_files(self, suffixes: tuple[str, ...] = (".py",)) -> list[str]:
        """RECORD entries (with these suffixes) that are gone from disk."""
        site = self.site()
        out = []
        for rel in self.files:
            if rel.endswith(suffixes) and not rel.startswith(("..", "/")) and "__pycache__" not in rel:
                if not os.path.exists(os.path.join(site, rel)):
                    out.append(rel)
        return out


class DistIndex:
    """Every installed distribution, grouped by normalized name, in sys.path order."""

    def __init__(self, path: list[str] | None = None) -> None:
        self.by_name: dict[str, list[Dist]] = {}
        for dist in md.distributions(path=path if path is not None else sys.path):
            try:
                name = dist.metadata["Name"]
                if not name:
                    continue
                info = str(getattr(dist, "_path", "") or "")
                loc = os.path.dirname(info) if info else str(dist.locate_file(""))
                files, tops = _record(dist)
                self.by_name.setdefault(normalize(name), []).append(
                    Dist(name, dist.version or "", loc, list(dist.requires or []), files, info, tops)
                )
            except Exception:  # a broken METADATA must not break the doctor
                continue

    def providers(self, top: str) -> list[Dist]:
        """Installed distributions that ship the top-level import name ``top`` (from their
        top_level.txt or RECORD), in sys.path order."""
        out: list[Dist] = []
        for dists in self.by_name.values():
            out += [d for d in dists if top in d.top_level]
        return out

    def owner_of(self, path: str) -> Dist | None:
        """The distribution whose RECORD lists the file ``path``."""
        real = os.path.realpath(path)
        for dists in self.by_name.values():
            for d in dists:
                site = os.path.realpath(d.site())
                if not real.startswith(site + os.sep):
                    continue
                rel = os.path.relpath(real, site).replace(os.sep, "/")
                if rel in d.files:
                    return d
        return None

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


def _record(dist: md.Distribution) -> tuple[list[str], list[str]]:
    """(RECORD file list, top-level import names) of an installed distribution."""
    files: list[str] = []
    try:
        text = dist.read_text("RECORD") or dist.read_text("installed-files.txt") or ""
    except Exception:
        text = ""
    for line in text.splitlines():
        rel = line.split(",", 1)[0].strip()
        if rel:
            files.append(rel)
    tops: list[str] = []
    try:
        top_txt = dist.read_text("top_level.txt") or ""
    except Exception:
        top_txt = ""
    for name in top_txt.split():
        if name and name not in tops:
            tops.append(name.replace("/", "."))
    for rel in files:
        first = rel.split("/", 1)[0]
        if not first or first.startswith(("..", "__pycache__")) or first.endswith((".dist-info", ".egg-info", ".data", ".pth")):
            continue
        name = first.split(".", 1)[0] if "/" not in rel else first
        if name.isidentifier() and name not in tops:
            tops.append(name)
    return files, tops


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


def find_top(name: str, path: list[str] | None = None) -> ModuleLoc:
    """Where ``import name`` resolves on ``path`` (default: this process's sys.path)."""
    try:
        if path is None:
            spec = importlib.util.find_spec(name)
        else:
            spec = importlib.machinery.PathFinder.find_spec(name, path)
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


def interpreter_flags() -> list[str]:
    """The interpreter flags (-I, -E, -s, -S) this process runs with, to pass on to probes."""
    flags = []
    if sys.flags.isolated:
        flags.append("-I")
    else:
        if sys.flags.ignore_environment:
            flags.append("-E")
        if sys.flags.no_user_site:
            flags.append("-s")
    if sys.flags.no_site:
        flags.append("-S")
    return flags


def user_sys_path(cwd: str | None = None, timeout: float = 30.0) -> list[str]:
    """``sys.path`` of the user's ``python`` started in ``cwd``: the current directory first
    (as ``python -c``/``python -m``/the REPL put it), then PYTHONPATH, the standard library and
    site-packages. The doctor's own ``sys.path`` differs when it runs as the ``verl-bridge``
    console script (its first entry is the script's folder, not the current directory)."""
    import json
    import subprocess

    cwd = cwd or os.getcwd()
    try:
        proc = subprocess.run([sys.executable, *interpreter_flags(), "-c", "import sys, json; print(json.dumps(sys.path))"],
                              capture_output=True, text=True, cwd=cwd, timeout=timeout, stdin=subprocess.DEVNULL)
        path = json.loads(proc.stdout.strip().splitlines()[-1])
    except Exception:  # fall back to our own path with the current directory first
        path = [""] + [p for p in sys.path[1:]]
    return [cwd if p in ("", ".") else p for p in path]


def cwd_shadow(loc: ModuleLoc, path: list[str], cwd: str | None = None) -> str | None:
    """The current directory when it is what ``loc`` resolves from only because ``python``
    puts the current directory first on sys.path; else None."""
    cwd = os.path.realpath(cwd or os.getcwd())
    if not loc.found:
        return None
    if loc.origin:
        entry = os.path.dirname(loc.origin)
        if os.path.basename(loc.origin).startswith("__init__."):
            entry = os.path.dirname(entry)
        entries = [entry]
    else:
        entries = [os.path.dirname(p) for p in loc.locations]
    if not entries or any(os.path.realpath(e) != cwd for e in entries[:1]):
        return None
    # the current directory is path[0]; when it is also listed later (PYTHONPATH=.), it is on purpose
    rest = [os.path.realpath(p) for p in path[1:]]
    return None if cwd in rest else cwd


def is_empty_tree(path: str) -> bool:
    """True for a directory that holds no files at all except ``__pycache__`` leftovers."""
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        if files:
            return False
    return True


def leftover_dir(loc: ModuleLoc) -> str | None:
    """A top-level name that resolves only to empty directories (an uninstall left the folder
    behind): ``import name`` then succeeds as an empty namespace package, and code that tests
    for the package by importing it (megatron.core does, for Transformer Engine) breaks."""
    if not loc.found or not loc.namespace or not loc.locations:
        return None
    if all(is_empty_tree(p) for p in loc.locations):
        return loc.locations[0]
    return None
