"""Regenerate ``data/mcore_history.json``: which megatron modules and public names exist in which
megatron-core release. Run at development time, offline, on wheels fetched once with pip::

    mkdir -p /tmp/mcore_wheels && cd /tmp/mcore_wheels
    for v in 0.8.0 0.9.0 0.10.0 0.11.0 0.12.0 0.12.1 0.12.2 0.12.3 0.13.0 0.13.1 0.14.0 \\
             0.15.0 0.15.1 0.15.2 0.15.3 0.16.0 0.16.1; do
        pip download --no-deps "megatron-core==$v" -d .; done
    # 0.17 and later only ship cp312 wheels
    for v in 0.17.0 0.17.1 0.18.0 0.18.2 0.19.0 0.19.2; do
        pip download --python-version 3.12 --only-binary=:all: --no-deps "megatron-core==$v" -d .; done
    python -m verl_bridge.doctor.build_mcore_history /tmp/mcore_wheels/*.whl

The wheels are read as zip files and their modules parsed with ``ast``; nothing is imported.
A module is every ``megatron/**.py`` file (``__init__.py`` names the package); its public names
are the names bound at module level (functions, classes, assignments, imports, also inside
top-level ``if``/``try`` blocks) that do not start with ``_``. The wheels are not committed.

File format (compact: ranges over the ordered release list)::

    {"releases": ["0.8.0", ...],
     "modules": {"megatron.core.x": "0-5", ...},          # index ranges, "a-b" or "a-b,c-d"
     "names":   {"megatron.core.x": {"0-5": "A B C", "3-5": "D"}, ...}}
"""

from __future__ import annotations

import ast
import json
import re
import sys
import zipfile
from pathlib import Path

DATA = Path(__file__).with_name("data") / "mcore_history.json"


def _vkey(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v))


def _bound_names(body: list[ast.stmt]) -> set[str]:
    out: set[str] = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        out.add(n.id)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
        elif isinstance(node, ast.Import):
            for a in node.names:
                out.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                if a.name != "*":
                    out.add(a.asname or a.name)
        elif isinstance(node, ast.If):
            out |= _bound_names(node.body) | _bound_names(node.orelse)
        elif isinstance(node, ast.Try):
            out |= _bound_names(node.body) | _bound_names(node.orelse) | _bound_names(node.finalbody)
            for h in node.handlers:
                out |= _bound_names(h.body)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            out |= _bound_names(node.body)
    return out


def read_wheel(path: str) -> tuple[str, dict[str, set[str]]]:
    """(version, {module: public names}) of one megatron-core wheel."""
    m = re.match(r"megatron_core-([\w.]+?)-", Path(path).name)
    if not m:
        raise SystemExit(f"not a megatron-core wheel: {path}")
    version = m.group(1)
    modules: dict[str, set[str]] = {}
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            name = info.filename
            if not (name.startswith("megatron/") and name.endswith(".py")):
                continue
            parts = name[:-3].split("/")
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if not all(p.isidentifier() for p in parts):
                continue
            mod = ".".join(parts)
            try:
                tree = ast.parse(zf.read(info).decode("utf-8", "replace"))
            except SyntaxError:
                names: set[str] = set()
            else:
                names = {n for n in _bound_names(tree.body) if not n.startswith("_")}
            modules[mod] = names
    # parent packages without an __init__.py (namespace packages) exist too
    for mod in list(modules):
        parts = mod.split(".")
        for i in range(1, len(parts)):
            modules.setdefault(".".join(parts[:i]), set())
    return version, modules


def _ranges(idx: list[int]) -> str:
    out: list[str] = []
    start = prev = idx[0]
    for i in idx[1:]:
        if i == prev + 1:
            prev = i
            continue
        out.append(f"{start}-{prev}")
        start = prev = i
    out.append(f"{start}-{prev}")
    return ",".join(out)


def build(wheels: list[str]) -> dict:
    per: dict[str, dict[str, set[str]]] = {}
    for w in wheels:
        v, mods = read_wheel(w)
        per[v] = mods
    releases = sorted(per, key=_vkey)
    modules: dict[str, str] = {}
    names: dict[str, dict[str, str]] = {}
    all_mods = sorted({m for mods in per.values() for m in mods})
    for mod in all_mods:
        present = [i for i, v in enumerate(releases) if mod in per[v]]
        modules[mod] = _ranges(present)
        by_range: dict[str, list[str]] = {}
        for name in sorted({n for i in present for n in per[releases[i]][mod]}):
            r = _ranges([i for i in present if name in per[releases[i]][mod]])
            by_range.setdefault(r, []).append(name)
        if by_range:
            names[mod] = {r: " ".join(ns) for r, ns in sorted(by_range.items())}
    return {"releases": releases, "modules": modules, "names": names}


def main(argv: list[str] | None = None) -> int:
    wheels = argv if argv is not None else sys.argv[1:]
    if not wheels:
        print(__doc__)
        return 2
    data = build(wheels)
    DATA.parent.mkdir(exist_ok=True)
    DATA.write_text(json.dumps(data, separators=(",", ":"), sort_keys=True) + "\n")
    print(f"{DATA}: {len(data['releases'])} releases ({data['releases'][0]} .. {data['releases'][-1]}), "
          f"{len(data['modules'])} modules, {DATA.stat().st_size // 1024} KiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
