"""``--explain``: name the root cause of a pasted traceback or log.

Every signature of ``knowledge.py`` whose patterns all match is a candidate; candidates are
ordered by specificity (weight), then by how late in the text they match (the last error of a
traceback is usually the root one). Undefined symbols are demangled and classified
(``symbols.py``) and ``cannot import name`` from megatron.core is looked up in the rename table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import renames, symbols
from .knowledge import SIGNATURES, Signature

_FLAGS = re.IGNORECASE | re.MULTILINE


@dataclass
class Match:
    id: str
    cause: str
    fix: str
    source: str = ""
    weight: int = 0
    position: int = 0

    def to_dict(self) -> dict:
        return {"id": self.id, "cause": self.cause, "fix": self.fix}


class _Blank(dict):
    def __missing__(self, key: str) -> str:
        return "?"


def _match_one(sig: Signature, text: str) -> Match | None:
    groups: dict[str, str] = {}
    last = 0
    for pattern in sig.all_of:
        found = list(re.finditer(pattern, text, _FLAGS))
        if not found:
            return None
        m = found[-1]
        last = max(last, m.start())
        groups.update({k: v for k, v in m.groupdict().items() if v is not None})
    for pattern in sig.none_of:
        if re.search(pattern, text, _FLAGS):
            return None
    values = _Blank(groups)
    return Match(sig.id, sig.cause.format_map(values), sig.fix.format_map(values), sig.source, sig.weight, last)


def _enrich(match: Match, text: str, torch_cxx11_abi: bool | None) -> None:
    if "undefined symbol" in text.lower() and match.id.endswith(("-abi", "-torch", "-core", "-legacy-extension", "-symbol", "-duplicate", "import-abi")):
        diags = symbols.diagnose(text, torch_cxx11_abi)
        if diags:
            d = diags[-1]
            lib = symbols.failing_library(text)
            where = f" in {lib}" if lib else ""
            match.cause += f". Undefined symbol{where}: {d.demangled}: {d.cause}"
    if match.id == "megatron-core-api":
        m = re.findall(r"cannot import name '(\w+)' from '(megatron\.core[\w.]*)'", text)
        if m:
            name, mod = m[-1]
            entry = renames.lookup(f"{mod}.{name}") or renames.lookup_name(name)
            if entry:
                match.cause += f". {entry.describe()}"
                if entry.new:
                    match.fix = f"use {entry.new} (" + entry.when() + ")\n" + match.fix


def explain(text: str, torch_cxx11_abi: bool | None = None, install=None) -> list[Match]:
    """Matches for ``text``, best first. ``install(module) -> fix`` names the distribution for a
    missing module (default: from this environment's metadata, ``dists.install_fix``)."""
    text = text or ""
    matches: list[Match] = []
    for sig in SIGNATURES:
        try:
            m = _match_one(sig, text)
        except re.error:
            continue
        if m is not None:
            matches.append(m)
    matches.sort(key=lambda m: (-m.weight, -m.position))
    for m in matches:
        _enrich(m, text, torch_cxx11_abi)
    if not matches:
        syms = symbols.diagnose(text, torch_cxx11_abi)
        if syms:
            d = syms[-1]
            lib = symbols.failing_library(text) or "a native extension"
            matches.append(Match("undefined-symbol", f"{lib} has an undefined symbol {d.demangled}: {d.cause}",
                                 "reinstall the package that owns it against the installed torch "
                                 "(pip install --force-reinstall --no-build-isolation <package>)"))
        if not matches:
            missing = re.findall(r"No module named '([\w.]+)'", text)
            if missing:
                mod = missing[-1]
                if install is None:
                    from . import dists, env

                    fix = dists.install_fix(mod, env.DistIndex())
                else:
                    fix = install(mod)
                matches.append(Match("python-missing-module", f"Python cannot find the module `{mod}` in this "
                                     "environment (not installed, its files were removed, or installed for another "
                                     "interpreter)", fix + "\n# then check again: verl-bridge doctor"))
    return matches
