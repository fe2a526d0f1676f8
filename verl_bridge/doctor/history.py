"""Which megatron modules and public names exist in which megatron-core release.

Read from ``data/mcore_history.json``, built offline from the real megatron-core wheels by
``build_mcore_history.py`` (releases 0.8.0 to 0.19.2). Used by ``--explain`` to answer
"``X`` exists in megatron-core 0.12.0 to 0.13.1; you have 0.16.1" with a pin or the module
that has the same names now, instead of a reinstall of the version already installed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from . import env


@dataclass(frozen=True)
class History:
    releases: tuple[str, ...]
    modules: dict[str, str]
    names: dict[str, dict[str, str]]


@lru_cache(maxsize=1)
def load() -> History:
    text = resources.files("verl_bridge.doctor").joinpath("data/mcore_history.json").read_text(encoding="utf-8")
    raw = json.loads(text)
    return History(tuple(raw["releases"]), raw["modules"], raw["names"])


def _expand(ranges: str) -> list[int]:
    out: list[int] = []
    for part in ranges.split(","):
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return out


def module_releases(mod: str) -> list[str]:
    h = load()
    r = h.modules.get(mod)
    return [h.releases[i] for i in _expand(r)] if r else []


def name_releases(mod: str, name: str) -> list[str]:
    h = load()
    for r, names in h.names.get(mod, {}).items():
        if name in names.split(" "):
            return [h.releases[i] for i in _expand(r)]
    return []


def names_in(mod: str, release: str) -> set[str]:
    h = load()
    if release not in h.releases:
        return set()
    i = h.releases.index(release)
    out: set[str] = set()
    for r, names in h.names.get(mod, {}).items():
        if i in _expand(r):
            out.update(names.split(" "))
    return out


def known_release(version: str | None) -> str | None:
    """The release of the table that ``version`` is (ignoring local labels), or the closest
    earlier one (a patch release the table lacks)."""
    if not version:
        return None
    h = load()
    t = env.vtuple(version)[:3]
    best = None
    for r in h.releases:
        if env.vtuple(r)[:3] <= t:
            best = r
    return best


def span(releases: list[str]) -> str:
    """'0.12.0 to 0.13.1', '>= 0.17.0', '<= 0.13.1' or 'only 0.10.0' (the table's first/last
    release stand for 'and earlier'/'and later' only when the span touches them)."""
    h = load()
    if not releases:
        return "no release"
    first, last = releases[0], releases[-1]
    gap = len(releases) != h.releases.index(last) - h.releases.index(first) + 1
    if first == h.releases[0] and last == h.releases[-1]:
        text = "every release from 0.8 to 0.19"
    elif first == h.releases[0]:
        text = f"<= {last}"
    elif last == h.releases[-1]:
        text = f">= {first}"
    elif first == last:
        text = f"only {first}"
    else:
        text = f"{first} to {last}"
    return text + (" (with gaps)" if gap else "")


@dataclass
class Finding:
    what: str              # the dotted module or module.name
    releases: list[str]    # megatron-core releases that have it
    installed: str | None  # installed megatron-core version
    replacement: str | None = None  # where the same thing lives in the installed release
    shared: tuple[str, ...] = ()     # the names that show it (for a module)

    def present_in_installed(self) -> bool:
        rel = known_release(self.installed)
        return rel is not None and rel in self.releases

    def pin(self) -> str | None:
        """The release to pin: the newest one that has it, when the installed one has not."""
        if not self.releases:
            return None
        if not self.installed or env.vcmp(self.releases[-1], self.installed) < 0:
            return self.releases[-1]  # nothing installed to stay close to, or only older releases have it
        later = [r for r in self.releases if env.vcmp(r, self.installed) > 0]
        return later[0] if later else self.releases[-1]


def _public_module(mod: str) -> bool:
    return not any(p.startswith("_") for p in mod.split("."))


def _common(a: str, b: str) -> int:
    x, y = a.split("."), b.split(".")
    n = 0
    while n < min(len(x), len(y)) and x[n] == y[n]:
        n += 1
    return n


def _alike(a: str, b: str) -> bool:
    x, y = a.rsplit(".", 1)[-1], b.rsplit(".", 1)[-1]
    return x in y or y in x


def find_module_replacement(mod: str, release: str | None) -> tuple[str, tuple[str, ...]] | None:
    """The module of ``release`` that holds the public classes/functions ``mod`` exported in its
    last release (where it was moved or renamed to). Ties go to the module whose name resembles
    the old one, then to the one nearest in the package tree. None when no module holds them."""
    rels = module_releases(mod)
    if not rels or not release:
        return None
    h = load()
    last = rels[-1]
    wanted = {n for n in names_in(mod, last) if n[:1].isupper() or "_" in n}
    prefix = mod + "."
    if not wanted:  # a package without exports: its submodules' classes
        for sub in h.modules:
            if sub.startswith(prefix) and last in module_releases(sub):
                wanted |= {n for n in names_in(sub, last) if n[:1].isupper()}
    if not wanted:
        return None
    best, best_key = None, None
    for cand in h.modules:
        if cand == mod or cand.startswith(prefix) or not _public_module(cand) or release not in module_releases(cand):
            continue
        shared = len(wanted & names_in(cand, release))
        if not shared:
            continue
        key = (shared, _alike(mod, cand), _common(mod, cand), -len(cand))
        if best_key is None or key > best_key:
            best, best_key = cand, key
    if best is None or best_key[0] * 2 < len(wanted):
        return None
    return best, tuple(sorted(wanted & names_in(best, release)))


def find_name_elsewhere(name: str, release: str | None, near: str) -> str | None:
    """The module of ``release`` that has ``name``, closest to ``near`` (same package first)."""
    if not release:
        return None
    h = load()
    hits = [m for m in h.modules if _public_module(m) and release in module_releases(m) and name in names_in(m, release)]
    if not hits:
        return None

    hits.sort(key=lambda m: (-_common(m, near), len(m)))
    return hits[0]


def lookup_module(mod: str, installed: str | None) -> Finding | None:
    """History of a megatron module that failed to import (None if no release ever had it)."""
    rels = module_releases(mod)
    if not rels:
        # a submodule the table lacks: report the closest known parent instead
        return None
    f = Finding(mod, rels, installed)
    if not f.present_in_installed():
        found = find_module_replacement(mod, known_release(installed))
        if found:
            f.replacement, f.shared = found
    return f


def lookup_name(mod: str, name: str, installed: str | None) -> Finding | None:
    rels = name_releases(mod, name)
    if not rels:
        return None
    f = Finding(f"{mod}.{name}", rels, installed)
    if not f.present_in_installed():
        f.replacement = find_name_elsewhere(name, known_release(installed), mod)
    return f
