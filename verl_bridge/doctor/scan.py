"""``--scan PATH``: find megatron names in user code that the installed megatron-core lacks.

User code is parsed with ``ast`` and never run. Every ``import``/``from ... import`` of
``megatron``, every attribute reached through such an import (``mpu.get_x()``) and every
renamed keyword (``model_comm_pgs=``) is resolved against the installed files, also parsed
with ``ast`` (megatron is never imported). Names that are absent, or present only as a
deprecated alias, are reported with the release where they moved (``renames.py``).
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from pathlib import Path

from . import env, renames

_SKIP_DIRS = {".git", "__pycache__", ".venv", "venv", "node_modules", ".tox", "build", "dist", ".eggs"}


@dataclass
class Finding:
    path: str
    line: int
    name: str
    status: str  # "missing" | "deprecated" | "renamed-keyword" | "megatron-lm" (needs a Megatron-LM checkout)
    message: str
    replacement: str | None = None
    version: str | None = None

    def to_dict(self) -> dict:
        return {"path": self.path, "line": self.line, "name": self.name, "status": self.status,
                "message": self.message, "replacement": self.replacement, "version": self.version}


class InstalledMegatron:
    """Answers 'does megatron.X.Y exist?' from the installed files, without importing."""

    def __init__(self) -> None:
        loc = env.find_top("megatron")
        self.locations = loc.locations if loc.found else []
        self.regular_package = loc.found and not loc.namespace
        self._names: dict[str, set[str] | None] = {}
        core = env.find_sub(self.locations, "core.package_info") if self.locations else None
        self.version = env.read_package_version(core) if core and core.endswith(".py") else None

    @property
    def available(self) -> bool:
        return bool(self.locations)

    def module_file(self, dotted: str) -> str | None:
        if dotted == "megatron":
            return None
        return env.find_sub(self.locations, dotted.split(".", 1)[1])

    def names(self, dotted: str) -> set[str] | None:
        """Top-level names of module ``dotted``; None when unknown (star import, __getattr__)."""
        if dotted in self._names:
            return self._names[dotted]
        path = self.module_file(dotted)
        result: set[str] | None = set()
        if path is None or not path.endswith(".py"):
            result = None if path else set()
        else:
            try:
                tree = ast.parse(Path(path).read_text(encoding="utf-8", errors="replace"))
                result = _defined_names(tree.body)
            except (OSError, SyntaxError, ValueError):
                result = None
        self._names[dotted] = result
        return result

    def exists(self, dotted: str) -> bool | None:
        """True/False when known; None when it cannot tell."""
        if dotted == "megatron":
            return True
        if self.module_file(dotted):
            return True
        parent, _, attr = dotted.rpartition(".")
        if not parent or parent == "megatron":
            return False
        if not self.module_file(parent):
            return False if self.exists(parent) is False else None
        names = self.names(parent)
        if names is None:
            return None
        return attr in names


def _defined_names(body: list[ast.stmt]) -> set[str] | None:
    names: set[str] = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == "__getattr__":
                return None
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        names.add(n.id)
        elif isinstance(node, ast.Import):
            for a in node.names:
                names.add((a.asname or a.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                if a.name == "*":
                    return None
                names.add(a.asname or a.name)
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            inner: list[ast.stmt] = list(getattr(node, "body", [])) + list(getattr(node, "orelse", []))
            inner += list(getattr(node, "finalbody", []))
            for h in getattr(node, "handlers", []):
                inner += h.body
            sub = _defined_names(inner)
            if sub is None:
                return None
            names |= sub
    return names


def _dotted(node: ast.AST) -> list[str] | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return parts[::-1]
    return None


class _Collector(ast.NodeVisitor):
    def __init__(self) -> None:
        self.uses: list[tuple[int, str]] = []  # (line, dotted name)
        self.keywords: list[tuple[int, str]] = []
        self.bindings: dict[str, str] = {}

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if a.name == "megatron" or a.name.startswith("megatron."):
                self.uses.append((node.lineno, a.name))
                if a.asname:
                    self.bindings[a.asname] = a.name
                else:
                    self.bindings["megatron"] = "megatron"

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        mod = node.module or ""
        if node.level or not (mod == "megatron" or mod.startswith("megatron.")):
            return
        for a in node.names:
            if a.name == "*":
                self.uses.append((node.lineno, mod))
                continue
            full = f"{mod}.{a.name}"
            self.uses.append((node.lineno, full))
            self.bindings[a.asname or a.name] = full

    def visit_Attribute(self, node: ast.Attribute) -> None:
        parts = _dotted(node)
        if parts and parts[0] in self.bindings:
            self.uses.append((node.lineno, ".".join([self.bindings[parts[0]], *parts[1:]])))
            return  # the chain is recorded whole; do not record its prefixes again
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        for kw in node.keywords:
            if kw.arg in renames.KEYWORDS:
                self.keywords.append((kw.lineno if hasattr(kw, "lineno") else node.lineno, kw.arg))
        self.generic_visit(node)


def python_files(path: str) -> list[Path]:
    """Python files under ``path``; a checkout's own ``megatron/core`` (megatron-core's sources,
    vendored in every Megatron-LM checkout) is not user code and is skipped."""
    p = Path(path)
    if p.is_file():
        return [p]
    out: list[Path] = []
    for root, dirs, files in os.walk(p):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith(".")
                         and not (d == "core" and os.path.basename(root) == "megatron"))
        out += [Path(root) / f for f in sorted(files) if f.endswith(".py")]
    return out


# Megatron-LM (the repository, not the megatron-core wheel): these live in a checkout only.
MEGATRON_LM_MODULES = ("megatron.training", "megatron.legacy", "megatron.mpu", "megatron.post_training",
                       "megatron.rl", "megatron.inference", "megatron.arguments", "megatron.initialize",
                       "megatron.global_vars", "megatron.checkpointing", "megatron.model", "megatron.tokenizer",
                       "megatron.text_generation", "megatron.optimizer", "megatron.utils", "megatron.data")
LM_REPLACEMENTS = {"megatron.mpu": "megatron.core.parallel_state",
                   "megatron.model.transformer": "megatron.core.transformer",
                   "megatron.optimizer": "megatron.core.optimizer"}


def megatron_lm_part(dotted: str) -> str | None:
    for mod in MEGATRON_LM_MODULES:
        if dotted == mod or dotted.startswith(mod + "."):
            return mod
    return None


def checkout_roots(paths: list[str]) -> list[str]:
    """Scanned folders that are Megatron-LM checkouts (they hold megatron/training): their own
    modules resolve names like megatron.training.get_args."""
    roots = []
    for path in paths:
        for cand in (Path(path), *Path(path).resolve().parents):
            if (cand / "megatron" / "training").is_dir() or (cand / "megatron" / "legacy").is_dir():
                roots.append(str(cand / "megatron"))
                break
    return roots


def scan(paths: list[str], installed: InstalledMegatron | None = None) -> tuple[list[Finding], list[str]]:
    """Findings for every file under ``paths`` and notes (unparsable files, no megatron)."""
    installed = installed or InstalledMegatron()
    for root in checkout_roots(paths):
        if root not in installed.locations:
            installed.locations = [*installed.locations, root]
            installed._names.clear()
    findings: list[Finding] = []
    notes: list[str] = []
    version = installed.version or "?"
    if not installed.available:
        notes.append("megatron is not installed: only the known renames were checked")
    for path in paths:
        if not os.path.exists(path):
            raise FileNotFoundError(path)
        for file in python_files(path):
            try:
                tree = ast.parse(file.read_text(encoding="utf-8", errors="replace"), filename=str(file))
            except (SyntaxError, ValueError) as exc:
                notes.append(f"{file}: not parsed ({exc.__class__.__name__}: {exc})")
                continue
            col = _Collector()
            col.visit(tree)
            seen: set[tuple[int, str]] = set()
            for line, dotted in col.uses:
                if (line, dotted) in seen:
                    continue
                seen.add((line, dotted))
                f = _judge(str(file), line, dotted, installed, version)
                if f:
                    findings.append(f)
            for line, kw in col.keywords:
                r = renames.KEYWORDS[kw]
                findings.append(Finding(str(file), line, kw, "renamed-keyword",
                                        f"keyword {kw}= -> {r.new}=: {r.when()}", r.new, r.changed))
    return findings, notes


def _judge(path: str, line: int, dotted: str, installed: InstalledMegatron, version: str) -> Finding | None:
    entry = renames.lookup(dotted)
    exists = installed.exists(dotted) if installed.available else None
    lm = megatron_lm_part(dotted)
    if lm and exists is not True and not entry:
        new = next((LM_REPLACEMENTS[k] + dotted[len(k):] for k in LM_REPLACEMENTS if dotted == k or
                    dotted.startswith(k + ".")), None)
        return Finding(path, line, dotted, "megatron-lm",
                       f"{lm} is Megatron-LM code, not part of megatron-core: it needs a Megatron-LM checkout on "
                       "PYTHONPATH" + (f"; megatron-core's counterpart is {new}" if new else ""), new, None)
    # Walk up to the shortest missing prefix so 'a.b.c.d' on a missing 'a.b' names 'a.b'.
    missing = dotted
    if exists is False:
        parts = dotted.split(".")
        for i in range(2, len(parts)):
            if installed.exists(".".join(parts[:i])) is False:
                missing = ".".join(parts[:i])
                break
    if exists is False:
        if entry:
            new = _apply(entry, dotted)
            return Finding(path, line, dotted, "missing",
                           f"{missing} is not in the installed megatron-core {version}: {entry.describe()}", new, entry.changed)
        return Finding(path, line, dotted, "missing",
                       f"{missing} is not in the installed megatron-core {version} (added in a later "
                       "release, or removed; check the megatron-core changelog)", None, None)
    if entry:
        new = _apply(entry, dotted)
        status = "deprecated" if exists else "missing" if not installed.available else "deprecated"
        return Finding(path, line, dotted, status, f"{entry.describe()}", new, entry.changed)
    return None


def _apply(entry: renames.Rename, dotted: str) -> str | None:
    if entry.new is None:
        return None
    if dotted == entry.old:
        return entry.new
    return entry.new + dotted[len(entry.old):]


def group(findings: list[Finding]) -> list[dict]:
    """Repeated findings folded: one entry per (name, status) with a count and the places."""
    groups: dict[tuple[str, str], dict] = {}
    for f in findings:
        key = (f.name if f.status != "megatron-lm" else (megatron_lm_part(f.name) or f.name), f.status)
        g = groups.setdefault(key, {"name": key[0], "status": f.status, "message": f.message,
                                    "replacement": f.replacement, "count": 0, "where": []})
        g["count"] += 1
        g["where"].append(f"{f.path}:{f.line}")
    order = {"missing": 0, "renamed-keyword": 1, "deprecated": 2, "megatron-lm": 3}
    return sorted(groups.values(), key=lambda g: (order.get(g["status"], 9), -g["count"], g["name"]))


def summary_line(findings: list[Finding], files: int | None = None) -> str:
    counts: dict[str, int] = {}
    for f in findings:
        counts[f.status] = counts.get(f.status, 0) + 1
    where = len({f.path for f in findings})
    parts = [f"{counts[k]} {label}" for k, label in (("missing", "missing from the installed megatron-core"),
                                                     ("renamed-keyword", "renamed keywords"),
                                                     ("deprecated", "deprecated"),
                                                     ("megatron-lm", "Megatron-LM names (need a checkout, not megatron-core)"))
             if counts.get(k)]
    return f"{len(findings)} findings in {where} files: " + ", ".join(parts) if findings else "no findings"
