"""The package's shape: no import cycles between verl_bridge modules, no reach-ins to other modules' privates.

Both checks read the source with ``ast`` (nothing is imported), so they see function-level imports
too; imports under ``if TYPE_CHECKING:`` are skipped (they never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "verl_bridge"


def _modules() -> dict[str, Path]:
    mods = {}
    for f in PKG.rglob("*.py"):
        rel = f.relative_to(REPO).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        mods[".".join(parts)] = f
    return mods


MODULES = _modules()
TREES = {m: ast.parse(f.read_text(encoding="utf-8"), filename=str(f)) for m, f in MODULES.items()}


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _nodes(tree: ast.AST):
    """Every node, minus the bodies of ``if TYPE_CHECKING:`` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                stack.extend(child.orelse)
            else:
                stack.append(child)


def _resolve(name: str) -> str | None:
    """The verl_bridge module that importing ``name`` names (a module, or the package holding an attribute)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def import_edges(module: str, tree: ast.AST) -> dict[str, tuple[int, str]]:
    """verl_bridge modules that ``module`` imports -> (line, the name imported, for messages)."""
    is_pkg = MODULES[module].name == "__init__.py"
    package = module if is_pkg else module.rpartition(".")[0]
    out: dict[str, tuple[int, str]] = {}
    for node in _nodes(tree):
        targets: list[tuple[str, str]] = []
        if isinstance(node, ast.Import):
            targets = [(a.name, a.name) for a in node.names if a.name.split(".")[0] == "verl_bridge"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            if base.split(".")[0] != "verl_bridge":
                continue
            for a in node.names:
                full = f"{base}.{a.name}"
                targets.append((full if full in MODULES else base, full))
        for target, named in targets:
            mod = _resolve(target)
            if mod and mod != module:
                out.setdefault(mod, (node.lineno, named))
    return out


GRAPH = {m: import_edges(m, t) for m, t in TREES.items()}


def import_cycles(graph: dict[str, dict]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[v] = min(low[v], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    cycles.append(sorted(comp))
    return cycles


def test_the_checker_sees_function_level_imports_and_cycles():
    tree = ast.parse("def f():\n    from verl_bridge.config import loader\n")
    assert "verl_bridge.config.loader" in import_edges("verl_bridge.config.schema", tree)
    assert import_cycles({"a": {"b": 0}, "b": {"c": 0}, "c": {"a": 0}, "d": {"a": 0}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b": 0}, "b": {}}) == []


def test_no_import_cycles_between_verl_bridge_modules():
    cycles = import_cycles(GRAPH)
    lines = []
    for comp in cycles:
        for m in comp:
            for target, (line, named) in sorted(GRAPH[m].items()):
                if target in comp:
                    lines.append(f"  {MODULES[m].relative_to(REPO)}:{line} imports {named}")
    assert not cycles, "import cycles between verl_bridge modules:\n" + "\n".join(lines)


def _own_private_names(tree: ast.AST) -> set[str]:
    """Private names a module defines: functions, classes, and attributes it assigns."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _third_party_names(tree: ast.AST) -> set[str]:
    """Local names bound to modules outside verl_bridge (their privates are a shim's business)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names
                      if a.name.split(".")[0] != "verl_bridge"}
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] != "verl_bridge":
            names |= {a.asname or a.name for a in node.names}
    return names


def private_reach_ins(module: str, tree: ast.AST) -> list[str]:
    own = _own_private_names(tree)
    foreign_modules = _third_party_names(tree)
    found = []
    for node in _nodes(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "verl_bridge":
            found += [f"{node.lineno}: from {node.module} import {a.name}" for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
            continue
        base = node.value
        root = base
        while isinstance(root, ast.Attribute):
            root = root.value
        trainer = (isinstance(base, ast.Name) and base.id == "trainer") or (
            isinstance(base, ast.Attribute) and base.attr == "trainer")
        if trainer:
            found.append(f"{node.lineno}: {ast.unparse(node)} (the trainer's private member)")
        elif isinstance(base, ast.Name) and base.id in ("self", "cls"):
            continue
        elif isinstance(root, ast.Name) and root.id in foreign_modules:
            continue
        elif node.attr not in own:
            found.append(f"{node.lineno}: {ast.unparse(node)} (defined in another module)")
    return sorted(found, key=lambda x: int(x.split(":")[0]))


def test_the_reach_in_checker_flags_trainer_privates():
    tree = ast.parse("def f(trainer, pl):\n    trainer._eval_samples = 1\n    return pl.trainer._prompts_for_step(1)\n")
    found = private_reach_ins("verl_bridge.x", tree)
    assert len(found) == 2 and all("trainer" in f for f in found)
    tree = ast.parse("from verl_bridge.rollout.verify import _next\nclass A:\n    def g(self, o):\n"
                     "        self._x = 1\n        return o._x, o._y\n")
    assert [f.split(": ", 1)[1] for f in private_reach_ins("verl_bridge.x", tree)] == [
        "from verl_bridge.rollout.verify import _next", "o._y (defined in another module)"]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_reaches_into_another_modules_privates(module):
    found = private_reach_ins(module, TREES[module])
    assert not found, f"{MODULES[module].relative_to(REPO)}:\n  " + "\n  ".join(found)


def test_tests_do_not_reach_into_the_trainer():
    found = []
    for f in (REPO / "tests").rglob("*.py"):
        if "fixtures" in f.parts:  # migrate fixtures are other projects' code
            continue
        tree = ast.parse(f.read_text(encoding="utf-8"))
        found += [f"{f.relative_to(REPO)}:{x}" for x in private_reach_ins("tests", tree) if "trainer" in x]
    assert not found, "\n".join(found)


# --- layers: nothing low in the house imports from above it -------------------------------------
# The packages that the trainer (``runtime/``) and the bridge (``bridge/``) stand on. They take the
# batch types, the trainer's state and roles, precision and hook helpers, the console lines and routing
# replay from ``common/``, never from ``runtime/`` or ``bridge/``.
LOWER = ("common", "compat", "distributed", "arch", "models", "checkpoint", "resharding", "rollout", "placement")
ABOVE = ("runtime", "bridge", "commands", "train", "cli", "migrate")
# the old module paths of what moved to common/: re-exports for users' imports, nothing else
MOVED = {"verl_bridge.runtime.batch", "verl_bridge.runtime.state", "verl_bridge.runtime.roles",
         "verl_bridge.runtime.routing_replay",
         "verl_bridge.bridge.precision", "verl_bridge.bridge.hooks"}


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def upward_imports(graph: dict[str, dict]) -> list[str]:
    bad = []
    for m, edges in sorted(graph.items()):
        if _package(m) not in LOWER:
            continue
        for target, (line, named) in sorted(edges.items()):
            if _package(target) in ABOVE:
                bad.append(f"{m}:{line} imports {named}")
    return bad


def test_the_layer_check_fails_on_an_upward_import():
    graph = {"verl_bridge.rollout.native": import_edges(
        "verl_bridge.rollout.native", ast.parse("def f():\n    from verl_bridge.runtime.batch import model_inputs\n"))}
    assert upward_imports(graph) == ["verl_bridge.rollout.native:2 imports verl_bridge.runtime.batch.model_inputs"]


def test_nothing_low_imports_from_above_it():
    bad = upward_imports(GRAPH)
    assert not bad, "modules below runtime/ and bridge/ import from above them (move the shared piece to common/):\n  " + "\n  ".join(bad)


@pytest.mark.parametrize("module", sorted(MOVED))
def test_moved_modules_are_only_re_exports(module):
    """The old paths stay importable for users, and nothing of ours uses them."""
    users = [m for m, edges in GRAPH.items() if module in edges and m not in MOVED]
    assert not users, f"{module} moved to verl_bridge.common; still imported by {users}"
    body = [n for n in TREES[module].body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    assert all(isinstance(n, ast.ImportFrom) and n.module.startswith("verl_bridge.common.") for n in body)
