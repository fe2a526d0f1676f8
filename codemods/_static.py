"""Static evaluation of a user's script: which value does an expression have, and where from.

Nothing here imports or runs the user's code. An expression evaluates to

* :class:`Known` - a Python value proven from the source, with the line of the literal it comes
  from (``clip = 0.2`` at line 12 evaluates to ``Known(0.2, 12)`` wherever ``clip`` is used);
* :class:`Runtime` - a value that only exists when the script runs (a command-line flag without
  a default, the world size, an environment variable), with the reason;
* ``None`` - anything else (not provable; callers treat it as "cannot map with certainty").

Sources understood: literals and arithmetic on them, module and function-local assignments
(single assignment, or all assignments agreeing), function parameters bound through every call
site in the file (or their defaults), ``self.x`` set in a class of the file, argparse
``add_argument(..., default=...)`` (dashed flags become underscore attributes), Megatron-LM's
``initialize_megatron(args_defaults={...})``, ``@dataclass`` argument classes (nested ones too,
CleanRL style), dict literals and keyword-constructed config objects (``PPOConfig(...)``).
"""

from __future__ import annotations

import ast
import dataclasses
import sys
from dataclasses import dataclass, field
from typing import Iterator, Optional, Union

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider


@dataclass(frozen=True)
class Known:
    value: object
    line: int


@dataclass(frozen=True)
class Runtime:
    why: str
    line: int


@dataclass(frozen=True)
class NoneUnlessGiven(Runtime):
    """An optional command-line flag without a default: argparse makes it None when it is not given."""


Ev = Optional[Union[Known, Runtime]]


@dataclass
class Record:
    """A structured value: dict literal, dataclass instance, keyword-built config, argparse args."""

    kind: str  # "dict" | "dataclass:<Name>" | "call:<Name>" | "args"
    fields: dict  # name -> (node, FuncInfo|None) or Known/Runtime
    line: int
    missing: str = "unknown"  # "unknown" | "runtime": what a missing field means


@dataclass
class FuncInfo:
    node: cst.FunctionDef
    qual: str
    name: str
    cls: Optional[str]
    parent: Optional["FuncInfo"]
    params: dict = field(default_factory=dict)  # name -> (index, cst.Param)
    assigns: dict = field(default_factory=dict)  # name -> list[expr node | None]  (None = not simple)
    module_globals: Optional[dict] = None  # the module-level assignments of the file it is defined in


RUNTIME_CALLS = {
    "torch.distributed.get_world_size": "the world size",
    "torch.distributed.get_rank": "the rank",
    "megatron.core.parallel_state.get_data_parallel_world_size": "the data-parallel size",
    "megatron.core.mpu.get_data_parallel_world_size": "the data-parallel size",
    "megatron.core.parallel_state.get_tensor_model_parallel_world_size": "the tensor-parallel size",
    "os.getenv": "an environment variable",
    "os.environ.get": "an environment variable",
    "torch.cuda.device_count": "the number of GPUs",
}

ARGS_SOURCES = {
    "megatron.training.get_args",
    "megatron.training.global_vars.get_args",
    "megatron.get_args",
}


def dotted(node: cst.CSTNode) -> Optional[str]:
    """``a.b.c`` for Name/Attribute chains, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr.value}" if base else None
    return None


# Children of every node of the programs being analysed (identity-keyed: CSTNode hashes by id).
# ``node.children`` runs a visitor that rebuilds the node; reading the dataclass fields is ~20x faster.
_CHILDREN: dict = {}
_FIELDS: dict = {}  # node type -> names of its fields, in lexical order
_IS_NODE: dict = {}  # type -> is it a CSTNode subclass (isinstance on libcst's ABCs is slow)


def _is_node_type(t) -> bool:
    r = _IS_NODE.get(t)
    if r is None:
        r = _IS_NODE[t] = issubclass(t, cst.CSTNode)
    return r


# fields holding only formatting (whitespace, parentheses, commas, blank lines and comments): the
# analysis never looks inside them, and skipping them halves the nodes of a file
_FORMATTING = {"lpar", "rpar", "comma", "semicolon", "newline", "leading_lines", "lines_after_decorators", "header",
               "footer", "trailing_whitespace", "equal", "colon", "dot"}


def kids(node) -> tuple:
    """The child nodes of *node* in source order, from its dataclass fields (formatting left out)."""
    t = type(node)
    names = _FIELDS.get(t)
    if names is None:
        names = [f.name for f in dataclasses.fields(node)
                 if f.name not in _FORMATTING and not f.name.startswith("whitespace")]
        if "decorators" in names:  # decorators come first in the source
            names.remove("decorators")
            names.insert(0, "decorators")
        names = _FIELDS[t] = tuple(names)
    out = []
    known = _IS_NODE
    for name in names:
        v = getattr(node, name)
        tv = type(v)
        if tv is list or tv is tuple:
            for x in v:
                r = known.get(type(x))
                if r is None:
                    r = _is_node_type(type(x))
                if r:
                    out.append(x)
        else:
            r = known.get(tv)
            if r is None:
                r = _is_node_type(tv)
            if r:
                out.append(v)
    return tuple(out)


def walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """Pre-order traversal with an explicit stack: deep expressions never hit the recursion limit."""
    stack = [node]
    get = _CHILDREN.get
    while stack:
        cur = stack.pop()
        yield cur
        children = get(cur)
        if children is None:
            children = kids(cur)
        if children:
            stack.extend(reversed(children))


# big third-party packages: never looked up as project modules
THIRD_PARTY = {"torch", "transformers", "trl", "trlx", "numpy", "datasets", "accelerate", "deepspeed", "megatron",
               "peft", "vllm", "ray", "openrlhf", "nemo", "nemo_aligner", "verl", "tqdm", "wandb", "gym",
               "gymnasium", "libcst", "yaml", "scipy", "pandas", "sklearn", "tensorboard", "apex", "flash_attn"}


def _find_module(roots: list, parts: list, exclude: str) -> Optional[str]:
    import os

    for root in roots:
        for cand in (os.path.join(root, *parts) + ".py", os.path.join(root, *parts, "__init__.py")):
            if os.path.isfile(cand) and os.path.abspath(cand) != exclude:
                return cand
    return None


# node types _index_node records something for; everything else is only descended into
_INDEXED = {cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.Assign, cst.AnnAssign, cst.AugAssign, cst.For, cst.CompFor,
            cst.AsName, cst.NamedExpr, cst.Import, cst.ImportFrom}


class Line(int):
    """A line number that remembers its file when it is not the script itself (a local module)."""

    file: Optional[str] = None

    def __new__(cls, value: int, file: Optional[str] = None):
        obj = super().__new__(cls, value)
        obj.file = file
        return obj


def literal_value(node: cst.BaseExpression):
    """Python value of a plain literal (number, string, bool, None, tuple/list of those)."""
    code = cst.Module(body=[]).code_for_node(node)
    try:
        return ast.literal_eval(code.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        raise ValueError(code) from None


class Program:
    """A parsed script with the indexes the evaluator and the recogniser need."""

    def __init__(self, module: cst.Module, filename: str = "<string>", wrapper: Optional[MetadataWrapper] = None,
                 source_dir: Optional[str] = None, _depth: int = 0, source: Optional[bytes] = None):
        self.filename = filename
        self.source = source
        self.module = wrapper.module if wrapper is not None else module
        if _depth == 0:
            _CHILDREN.clear()
        # one pass over the tree: children and parents of every node (no libcst metadata pass: those
        # cost seconds on a 20,000-line file); line numbers are computed per top-level statement on demand
        self._own_parents: dict = {}
        self._order: list = []
        stack = [self.module]
        while stack:
            cur = stack.pop()
            self._order.append(cur)
            children = kids(cur)
            _CHILDREN[cur] = children
            for child in children:
                self._own_parents[child] = cur
            stack.extend(reversed(children))
        self.parents = self._own_parents
        self._top_offsets: Optional[dict] = None
        self._positions: dict = {}
        self.funcs: dict[int, FuncInfo] = {}  # id(FunctionDef) -> info
        self.funcs_by_qual: dict[str, FuncInfo] = {}
        self.classes: dict[str, cst.ClassDef] = {}
        self.module_assigns: dict[str, list] = {}
        self.imports: dict[str, str] = {}  # local name -> qualified
        self.import_lines: dict[str, int] = {}  # local name -> line of its import
        self.unpacks: dict = {}  # (id(assigns), name) -> (call, index): ``a, b = parser.parse_...()``
        self.item_sets: dict = {}  # (id(assigns), name) -> {key: (value, scope)}: ``cfg["k"] = v``
        self._index(self.module.body, None, None, self.module_assigns)
        self._calls_by_callee: Optional[dict[str, list]] = None
        self._args_record: Optional[Record] = None
        # record kind -> fn(program, record, field, line) -> Ev: fields a framework's config object
        # computes from the others (TRL's PPOConfig.total_ppo_epochs), set by the recogniser
        self.derived_fields: dict = {}
        self._stack: set = set()
        self._value_uses: Optional[set] = None
        # set while the recogniser checks how a per-rank value scales with the world size (None: run time)
        self.assume_world_size: Optional[int] = None
        self.modules: list[cst.Module] = [self.module]
        self.local_modules: dict[str, "Program"] = {}  # module name -> its Program (same folder)
        self.source_dir = source_dir
        if source_dir is not None and _depth < 2:
            self._load_local_modules(source_dir, _depth)

    # ------------------------------------------------------------------ indexing
    def line(self, node: cst.CSTNode) -> int:
        if node in self._own_parents or node is self.module:
            return self._line_own(node)
        for sub in getattr(self, "local_modules", {}).values():
            if node in sub._own_parents:
                return Line(sub._line_own(node), sub.filename)
        return 0

    def _line_own(self, node: cst.CSTNode) -> int:
        top = node
        parent = self._own_parents.get(top)
        while parent is not None and parent is not self.module:
            top = parent
            parent = self._own_parents.get(top)
        if parent is None:
            return 0
        if self._top_offsets is None:
            self._top_offsets = self._first_lines()
        first = self._top_offsets.get(top)
        pos = self._positions.get(top)
        if pos is None:
            mini = self.module.with_changes(header=[], body=[top], footer=[])
            pos = MetadataWrapper(mini, unsafe_skip_copy=True).resolve(PositionProvider)
            self._positions[top] = pos
        try:
            line = pos[node].start.line
        except KeyError:
            return 0
        if first is None:
            return line
        mini_first = min([pos[top].start.line] + [pos[d].start.line for d in getattr(top, "decorators", ())])
        return line + first - mini_first

    def _first_lines(self) -> dict:
        """Line of the first token of each top-level statement, from Python's own parser (fast)."""
        src = self.source if self.source is not None else self.module.code
        try:
            body = ast.parse(src).body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return {}
        out, k = {}, 0
        for stmt in self.module.body:
            if k >= len(body):
                break
            a = body[k]
            out[stmt] = min([a.lineno] + [d.lineno for d in getattr(a, "decorator_list", ())])
            k += len(stmt.body) if isinstance(stmt, cst.SimpleStatementLine) else 1
        return out

    # ------------------------------------------------------------------ local modules
    def _load_local_modules(self, source_dir: str, depth: int) -> None:
        """Read (never execute) modules of the project that the script imports: ``from loss import
        GRPOLoss``, ``import rl_utils``, ``from dschat.rlhf.ppo_trainer import Trainer`` (found in the
        script's folder or up to two folders above it, as ``sys.path.append('..')`` scripts do).
        Their functions and classes join this program's indexes."""
        import os

        here = os.path.abspath(os.path.join(source_dir, self.filename))
        roots = [os.path.abspath(source_dir)]
        for _ in range(2):
            up = os.path.dirname(roots[-1])
            if up == roots[-1]:
                break
            roots.append(up)
        wanted: dict = {}
        for local, qual in self.imports.items():
            parts = qual.lstrip(".").split(".")
            if parts[0] in sys.stdlib_module_names or parts[0] in THIRD_PARTY:
                continue
            for n in range(len(parts), 0, -1):
                path = _find_module(roots, parts[:n], here)
                if path is not None:
                    wanted.setdefault((".".join(parts[:n]), path), []).append((local, ".".join(parts[n:]) or None))
                    break
        for (mod, path), names in sorted(wanted.items()):
            if mod in self.local_modules:
                self._merge(mod, self.local_modules[mod], names)
                continue
            try:
                with open(path, "rb") as fh:
                    sub_src = fh.read()
                sub_tree = cst.parse_module(sub_src)
            except (OSError, cst.ParserSyntaxError, UnicodeDecodeError):
                continue
            rel = os.path.relpath(path, source_dir).replace(os.sep, "/")
            sub = Program(sub_tree, rel, source_dir=os.path.dirname(path), _depth=depth + 1, source=sub_src)
            self._merge(mod, sub, names)

    def local_module_of(self, qual: str) -> Optional["Program"]:
        return self.local_modules.get(qual.lstrip("."))

    def _merge(self, root: str, sub: "Program", names: list) -> None:
        from collections import ChainMap

        merged = self.__dict__.setdefault("_merged", set())
        self.local_modules[root] = sub
        if id(sub) not in merged:
            merged.add(id(sub))
            for name, prog in sub.local_modules.items():
                self.local_modules.setdefault(name, prog)
                merged.add(id(prog))  # its nodes and functions came in with *sub*
            self.unpacks.update(sub.unpacks)
            self.item_sets.update(sub.item_sets)
            self.parents = ChainMap(self.parents, sub.parents) if not isinstance(self.parents, ChainMap) else \
                self.parents.new_child(sub.parents)
            self.funcs.update(sub.funcs)
            self.modules.extend(sub.modules)
            for qual, info in sub.funcs_by_qual.items():
                self.funcs_by_qual.setdefault(f"{root}.{qual}", info)
                self.funcs_by_qual.setdefault(qual, info)
            for cname, cdef in sub.classes.items():
                self.classes.setdefault(cname, cdef)
        for local, member in names:
            if member is None:
                continue
            if member in sub.classes:
                self.classes.setdefault(local, sub.classes[member])
                for qual, info in sub.funcs_by_qual.items():
                    if qual.startswith(member + "."):
                        self.funcs_by_qual.setdefault(local + qual[len(member):], info)
            elif member in sub.funcs_by_qual:
                self.funcs_by_qual.setdefault(local, sub.funcs_by_qual[member])
            elif member in sub.module_assigns:
                self.module_assigns.setdefault(local, sub.module_assigns[member])

    def qnames(self, node: cst.CSTNode) -> set[str]:
        """Qualified name of a dotted reference through the imports (``F.relu`` -> torch.nn.functional.relu)."""
        d = dotted(node)
        if not d:
            return set()
        first, _, rest = d.partition(".")
        q = self.imports.get(first)
        if q is None:
            return set()
        return {f"{q}.{rest}" if rest else q}

    def _index(self, body, cls: Optional[str], parent: Optional[FuncInfo], assigns: dict) -> None:
        for stmt in body:
            for node in self._statements_and_nested(stmt):
                self._index_node(node, cls, parent, assigns)

    def _statements_and_nested(self, stmt):
        yield stmt

    def _index_node(self, node, cls, parent, assigns):
        t = type(node)
        if t not in _INDEXED:
            # nothing to record here: descend (most nodes of a large file take only this branch)
            for child in _CHILDREN.get(node) or kids(node):
                self._index_node(child, cls, parent, assigns)
            return
        if isinstance(node, cst.FunctionDef):
            if parent is not None:
                qual = f"{parent.qual}.<locals>.{node.name.value}"
            elif cls is not None:
                qual = f"{cls}.{node.name.value}"
            else:
                qual = node.name.value
            info = FuncInfo(node=node, qual=qual, name=node.name.value, cls=cls if parent is None else None, parent=parent,
                            module_globals=self.module_assigns)
            params = list(node.params.posonly_params) + list(node.params.params)
            for i, p in enumerate(params):
                info.params[p.name.value] = (i, p)
            for p in node.params.kwonly_params:
                info.params[p.name.value] = (None, p)
            self.funcs[id(node)] = info
            self.funcs_by_qual.setdefault(qual, info)
            self._record_assign(assigns, node.name.value, None)
            if isinstance(node.body, cst.IndentedBlock):
                self._index(node.body.body, None, info, info.assigns)
            return
        if isinstance(node, cst.ClassDef):
            if parent is None and cls is None:
                self.classes[node.name.value] = node
            self._record_assign(assigns, node.name.value, None)
            if isinstance(node.body, cst.IndentedBlock):
                self._index(node.body.body, node.name.value, parent, {} if parent is None else assigns)
            return
        if isinstance(node, cst.Lambda):
            return
        if isinstance(node, cst.Assign):
            for t in node.targets:
                if isinstance(t.target, cst.Name):
                    self._record_assign(assigns, t.target.value, node.value if len(node.targets) == 1 else node.value)
                elif isinstance(t.target, (cst.Tuple, cst.List)) and isinstance(node.value, (cst.Tuple, cst.List)) and \
                        len(t.target.elements) == len(node.value.elements) and \
                        all(isinstance(el.value, cst.Name) and not isinstance(el, cst.StarredElement)
                            for el in t.target.elements) and \
                        not any(isinstance(el, cst.StarredElement) for el in node.value.elements):
                    # GAMMA, LAM = 1.0, 0.95: each name gets its own element
                    for el, v in zip(t.target.elements, node.value.elements):
                        self._record_assign(assigns, el.value.value, v.value)
                else:
                    for n in walk(t.target):
                        if isinstance(n, cst.Name) and not self._is_attr_part(t.target, n):
                            self._record_assign(assigns, n.value, None)
                    tgt = t.target
                    if (isinstance(tgt, cst.Subscript) and isinstance(tgt.value, cst.Name) and len(tgt.slice) == 1
                            and isinstance(tgt.slice[0].slice, cst.Index)
                            and isinstance(tgt.slice[0].slice.value, cst.SimpleString)):
                        try:
                            key = literal_value(tgt.slice[0].slice.value)
                        except ValueError:
                            key = None
                        if isinstance(key, str):
                            owner = self._binding_assigns(tgt.value.value, parent, assigns)
                            self.item_sets.setdefault((id(owner), tgt.value.value), {})[key] = (node.value, parent)
                    if isinstance(t.target, (cst.Tuple, cst.List)) and isinstance(node.value, cst.Call):
                        for i, el in enumerate(t.target.elements):
                            if isinstance(el.value, cst.Name):
                                self.unpacks[(id(assigns), el.value.value)] = (node.value, i)
        elif isinstance(node, cst.AnnAssign):
            if isinstance(node.target, cst.Name):
                self._record_assign(assigns, node.target.value, node.value)
        elif isinstance(node, (cst.AugAssign,)):
            if isinstance(node.target, cst.Name):
                self._record_assign(assigns, node.target.value, None)
        elif isinstance(node, (cst.For, cst.CompFor)):
            for n in walk(node.target):
                if isinstance(n, cst.Name):
                    self._record_assign(assigns, n.value, None)
        elif isinstance(node, cst.AsName):
            for n in walk(node.name):
                if isinstance(n, cst.Name):
                    self._record_assign(assigns, n.value, None)
        elif isinstance(node, cst.NamedExpr):
            if isinstance(node.target, cst.Name):
                self._record_assign(assigns, node.target.value, None)
        elif isinstance(node, (cst.Import, cst.ImportFrom)):
            self._index_import(node, top=parent is None and cls is None)
        for child in _CHILDREN.get(node) or kids(node):
            self._index_node(child, cls, parent, assigns)

    def _binding_assigns(self, name: str, scope: Optional[FuncInfo], assigns: dict) -> dict:
        """The assignment table that binds *name* as seen from *scope* (its function, an enclosing one,
        or the module)."""
        cur = scope
        while cur is not None:
            if name in cur.assigns:
                return cur.assigns
            cur = cur.parent
        return self.module_assigns if name in self.module_assigns or scope is None else assigns

    @staticmethod
    def _is_attr_part(target, n) -> bool:
        # names inside ``a.b = ...`` or ``a[i] = ...`` targets are not rebinding ``a``
        return not isinstance(target, (cst.Name, cst.Tuple, cst.List, cst.StarredElement))

    @staticmethod
    def _record_assign(assigns: dict, name: str, value) -> None:
        assigns.setdefault(name, []).append(value)

    def _index_import(self, node, top: bool = True) -> None:
        """Top-level imports bind names; an import inside a function only fills names not bound yet."""
        saved = dict(self.imports)
        self._index_import_names(node)
        if not top:
            for name, q in saved.items():
                self.imports[name] = q
        for name in set(self.imports) - set(saved):
            self.import_lines[name] = self.line(node)

    def _index_import_names(self, node) -> None:
        if isinstance(node, cst.Import):
            for alias in node.names:
                full = dotted(alias.name)
                if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                    self.imports[alias.asname.name.value] = full
                else:
                    self.imports[full.split(".")[0]] = full.split(".")[0]
        elif isinstance(node.names, cst.ImportStar):
            return
        else:
            mod = dotted(node.module) if node.module is not None else ""
            mod = "." * len(node.relative) + (mod or "")
            for alias in node.names:
                name = dotted(alias.name)
                local = alias.asname.name.value if alias.asname is not None else name
                self.imports[local] = f"{mod}.{name}" if mod else name

    def all_nodes(self) -> list:
        """Every node of the script and of the local modules it imports (computed once)."""
        if getattr(self, "_all_nodes", None) is None:
            self._all_nodes = list(self._order)
            for sub in {id(m): m for m in self.local_modules.values()}.values():
                self._all_nodes.extend(sub._order)
        return self._all_nodes

    def nodes_of(self, *types) -> list:
        """``(node, enclosing FuncInfo)`` for every node of these (concrete) types, in source order."""
        cache = self.__dict__.setdefault("_by_type", {})
        if types not in cache:
            wanted = set(types)
            cache[types] = [(n, self.func_of(n)) for n in self.all_nodes() if type(n) in wanted]
        return cache[types]

    # ------------------------------------------------------------------ scopes
    def func_of(self, node: cst.CSTNode) -> Optional[FuncInfo]:
        cur = node
        while True:
            cur = self.parents.get(cur)
            if cur is None:
                return None
            if isinstance(cur, cst.FunctionDef):
                return self.funcs.get(id(cur))

    def class_of(self, func: Optional[FuncInfo]) -> Optional[str]:
        while func is not None:
            if func.cls:
                return func.cls
            func = func.parent
        return None

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        cur = node
        while True:
            cur = self.parents.get(cur)
            if cur is None:
                return
            yield cur

    # ------------------------------------------------------------------ call sites
    def calls_by_callee(self) -> dict[str, list]:
        """Map function qualname -> [(Call node, caller FuncInfo|None, arg offset)]."""
        if self._calls_by_callee is not None:
            return self._calls_by_callee
        out: dict[str, list] = {}
        for node in self.all_nodes():
            if not isinstance(node, cst.Call):
                continue
            caller = self.func_of(node)
            target = self.resolve_callee(node, caller)
            if target is not None:
                info, offset = target
                out.setdefault(info.qual, []).append((node, caller, offset))
        self._calls_by_callee = out
        return out

    def resolve_callee(self, call: cst.Call, caller: Optional[FuncInfo]):
        """The file's FuncInfo a call reaches (and how many leading params are implicit), or None."""
        f = call.func
        if isinstance(f, cst.Name):
            name = f.value
            scope = caller
            while scope is not None:  # nested function defined in an enclosing function
                nested = self.funcs_by_qual.get(f"{scope.qual}.<locals>.{name}")
                if nested is not None:
                    return nested, 0
                if name in scope.assigns or name in scope.params:
                    alias = self.class_named(name, caller) if name in scope.assigns else None
                    if alias is not None:  # trainer_cls = Sub if flag else Base; trainer_cls(...)
                        init = self.method_of(alias, "__init__")
                        return (init, 1) if init is not None else None
                    return self._instance_call(f, caller)
                scope = scope.parent
            if name in self.module_assigns and name not in self.funcs_by_qual and name not in self.classes:
                return self._instance_call(f, caller)
            if name in self.classes:
                init = self.funcs_by_qual.get(f"{name}.__init__")
                return (init, 1) if init is not None else None
            info = self.funcs_by_qual.get(name)
            if info is not None and info.cls is None and info.parent is None:
                return info, 0
            return None
        if isinstance(f, cst.Attribute):
            method = f.attr.value
            recv = f.value
            cls = None
            if isinstance(recv, cst.Name) and recv.value == "self":
                cls = self.class_of(caller)
            elif isinstance(recv, cst.Name) or isinstance(recv, cst.Attribute):
                cls = self.instance_class(recv, caller)
            elif isinstance(recv, cst.Call) and isinstance(recv.func, cst.Name) and recv.func.value in self.classes:
                cls = recv.func.value
            if cls is not None:
                info = self.method_of(cls, method)
                if info is not None:
                    return info, 1
            d = dotted(recv)
            if d and d.split(".")[0] in self.imports:
                first, _, rest = d.partition(".")
                sub = self.local_module_of(self.imports[first] + (f".{rest}" if rest else ""))
                if sub is not None:
                    info = sub.funcs_by_qual.get(method)
                    if info is not None and info.cls is None and info.parent is None:
                        return info, 0
            if isinstance(recv, cst.Name) and recv.value == "self":
                return self._instance_call(f, caller)
        return None

    def _instance_call(self, f, caller):
        """``objective(...)`` / ``self.loss_fn(...)`` where the object is an instance of a class of the
        program: the call runs its ``forward`` (torch modules) or ``__call__``."""
        cls = self.instance_class(f, caller)
        if cls is None:
            return None
        for meth in ("forward", "__call__"):
            info = self.funcs_by_qual.get(f"{cls}.{meth}")
            if info is not None:
                return info, 1
        return None

    def instance_class(self, recv: cst.BaseExpression, scope: Optional[FuncInfo]) -> Optional[str]:
        """Class (of this file) that a receiver expression was built from, when a single assignment says so."""
        exprs = []
        if isinstance(recv, cst.Name):
            exprs = self.assignments_of(recv.value, scope)
        elif isinstance(recv, cst.Attribute) and isinstance(recv.value, cst.Name) and recv.value.value == "self":
            cls = self.class_of(scope)
            if cls:
                exprs = [v for (v, _) in self.self_assignments(cls, recv.attr.value)]
        if len(exprs) == 1 and isinstance(exprs[0], cst.Call) and isinstance(exprs[0].func, cst.Name):
            return self.class_named(exprs[0].func.value, scope)
        return None

    def class_named(self, name: str, scope: Optional[FuncInfo], _seen: int = 0) -> Optional[str]:
        """The class (of this program) a name stands for: the class itself, or a variable bound once to a
        class or to ``A if cond else B`` (``trainer_cls = Unsup if args.unsup else Base``): the branch the
        condition picks when it is known, else the class the other candidates derive from."""
        if name in self.classes:
            return name
        if _seen > 3:
            return None
        exprs = self.assignments_of(name, scope)
        if len(exprs) != 1:
            return None
        e = exprs[0]
        if isinstance(e, cst.Name):
            return self.class_named(e.value, scope, _seen + 1)
        if isinstance(e, cst.IfExp) and isinstance(e.body, cst.Name) and isinstance(e.orelse, cst.Name):
            a = self.class_named(e.body.value, scope, _seen + 1)
            b = self.class_named(e.orelse.value, scope, _seen + 1)
            if a is None or b is None:
                return a or b
            test = self.ev(e.test, scope)
            if isinstance(test, Known) and not isinstance(test.value, Record):
                return a if test.value else b
            if a in self.class_ancestors(b):
                return a
            if b in self.class_ancestors(a):
                return b
            return a
        return None

    def class_ancestors(self, cls: str) -> list:
        """The program's own base classes of *cls*, nearest first (``class B(A)`` -> [A, ...])."""
        out, todo = [], [cls]
        while todo:
            cdef = self.classes.get(todo.pop(0))
            if cdef is None:
                continue
            for b in cdef.bases:
                name = b.value.value if isinstance(b.value, cst.Name) else (
                    b.value.attr.value if isinstance(b.value, cst.Attribute) else None)
                if name and name in self.classes and name not in out and name != cls:
                    out.append(name)
                    todo.append(name)
        return out

    def method_of(self, cls: str, method: str) -> Optional[FuncInfo]:
        """``cls.method``, found on the class or, when it does not define it, on its own base classes."""
        info = self.funcs_by_qual.get(f"{cls}.{method}")
        if info is not None:
            return info
        for base in self.class_ancestors(cls):
            info = self.funcs_by_qual.get(f"{base}.{method}")
            if info is not None:
                return info
        return None

    def assignments_of(self, name: str, scope: Optional[FuncInfo]) -> list:
        globs = self.globals_of(scope)
        while scope is not None:
            if name in scope.assigns:
                return list(scope.assigns[name])
            if name in scope.params:
                return []
            scope = scope.parent
        return list(globs.get(name, []))

    def self_assignments(self, cls: str, attr: str) -> list:
        out = []
        for info in self.funcs.values():
            if info.cls != cls:
                continue
            for node in walk(info.node.body):
                if isinstance(node, cst.Assign):
                    for t in node.targets:
                        tgt = t.target
                        if (isinstance(tgt, cst.Attribute) and isinstance(tgt.value, cst.Name)
                                and tgt.value.value == "self" and tgt.attr.value == attr):
                            out.append((node.value, info))
                elif isinstance(node, (cst.AugAssign, cst.AnnAssign)):
                    tgt = node.target
                    if (isinstance(tgt, cst.Attribute) and isinstance(tgt.value, cst.Name)
                            and tgt.value.value == "self" and tgt.attr.value == attr):
                        out.append((getattr(node, "value", None) if isinstance(node, cst.AnnAssign) else None, info))
        # class-level attribute
        cdef = self.classes.get(cls)
        if cdef is not None and not out:
            for stmt in cdef.body.body:
                if isinstance(stmt, cst.SimpleStatementLine):
                    for small in stmt.body:
                        if isinstance(small, cst.Assign) and len(small.targets) == 1:
                            t = small.targets[0].target
                            if isinstance(t, cst.Name) and t.value == attr:
                                out.append((small.value, None))
                        elif isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name) and small.target.value == attr:
                            out.append((small.value, None))
        return out

    # ------------------------------------------------------------------ evaluation
    def ev(self, node: Optional[cst.BaseExpression], scope: Optional[FuncInfo]) -> Ev:
        if node is None:
            return None
        key = (id(node), id(scope))
        if key in self._stack or len(self._stack) > 60:
            return None
        self._stack.add(key)
        try:
            return self._ev(node, scope)
        finally:
            self._stack.discard(key)

    def ev_record(self, node, scope) -> Optional[Record]:
        r = self.ev(node, scope)
        if isinstance(r, Known) and isinstance(r.value, Record):
            return r.value
        return None

    def _ev(self, node, scope) -> Ev:
        line = self.line(node)
        if isinstance(node, (cst.Integer, cst.Float, cst.SimpleString, cst.ConcatenatedString)):
            try:
                return Known(literal_value(node), line)
            except ValueError:
                return None
        if isinstance(node, (cst.Tuple, cst.List)):
            vals = [self.ev(e.value, scope) for e in node.elements]
            if all(isinstance(v, Known) for v in vals):
                return Known(tuple(v.value for v in vals), line)
            rt = next((v for v in vals if isinstance(v, Runtime)), None)
            return rt
        if isinstance(node, cst.Dict):
            fields = {}
            for el in node.elements:
                if isinstance(el, cst.DictElement):
                    k = self.ev(el.key, scope)
                    if isinstance(k, Known) and isinstance(k.value, str):
                        fields[k.value] = (el.value, scope)
                    else:
                        return None
                else:
                    return None
            return Known(Record("dict", fields, line), line)
        if isinstance(node, cst.Name):
            if node.value in ("True", "False", "None"):
                return Known({"True": True, "False": False, "None": None}[node.value], line)
            return self.ev_name(node.value, scope, line)
        if isinstance(node, cst.UnaryOperation):
            v = self.ev(node.expression, scope)
            if isinstance(v, Known) and isinstance(v.value, (int, float)) and not isinstance(v.value, bool):
                if isinstance(node.operator, cst.Minus):
                    return Known(-v.value, v.line)
                if isinstance(node.operator, cst.Plus):
                    return v
            if isinstance(v, Known) and isinstance(node.operator, cst.Not):
                return Known(not v.value, v.line)
            return v if isinstance(v, Runtime) else None
        if isinstance(node, cst.BinaryOperation):
            a, b = self.ev(node.left, scope), self.ev(node.right, scope)
            if isinstance(a, Runtime):
                return a
            if isinstance(b, Runtime):
                return b
            if isinstance(a, Known) and isinstance(b, Known):
                return self._arith(node.operator, a, b, line)
            return None
        if isinstance(node, cst.Attribute):
            return self.ev_attr(node, scope)
        if isinstance(node, cst.Comparison) and len(node.comparisons) == 1:
            # ``args.optimizer == "adam"``: a branch the defaults decide
            left, right = self.ev(node.left, scope), self.ev(node.comparisons[0].comparator, scope)
            if isinstance(left, Runtime):
                return left
            if isinstance(right, Runtime):
                return right
            if isinstance(left, Known) and isinstance(right, Known) and not isinstance(left.value, Record) \
                    and not isinstance(right.value, Record):
                op, x, y = node.comparisons[0].operator, left.value, right.value
                try:
                    if isinstance(op, cst.Equal):
                        return Known(x == y, line)
                    if isinstance(op, cst.NotEqual):
                        return Known(x != y, line)
                    if isinstance(op, cst.Is) and (x is None or y is None or isinstance(x, bool)):
                        return Known(x is y, line)
                    if isinstance(op, cst.IsNot) and (x is None or y is None or isinstance(x, bool)):
                        return Known(x is not y, line)
                except Exception:  # noqa: BLE001 - a comparison we cannot decide is not a value
                    return None
            return None
        if isinstance(node, cst.Subscript):
            if len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
                base_d = dotted(node.value)
                if base_d and self._resolve_qual(node.value) in ("os.environ",):
                    return Runtime(f"{base_d}[...] is an environment variable", line)
                idx_node = node.slice[0].slice.value
                if isinstance(node.value, cst.Call) and isinstance(idx_node, cst.Integer):
                    # ``parser.parse_args_into_dataclasses()[0]``, ``parse_args()[0]``
                    got = self.ev_unpack(node.value, int(idx_node.value), scope)
                    if got is not None:
                        return got
                rec = self.ev_record(node.value, scope)
                k = self.ev(idx_node, scope)
                if rec is not None and isinstance(k, Known) and isinstance(k.value, str):
                    return self.record_field(rec, k.value, line)
            return None
        if isinstance(node, cst.Call):
            return self.ev_call(node, scope)
        return None

    @staticmethod
    def _arith(op, a: Known, b: Known, line: int) -> Ev:
        x, y = a.value, b.value
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (x, y)):
            return None
        try:
            if isinstance(op, cst.Add):
                r = x + y
            elif isinstance(op, cst.Subtract):
                r = x - y
            elif isinstance(op, cst.Multiply):
                r = x * y
            elif isinstance(op, cst.Divide):
                r = x / y
            elif isinstance(op, cst.FloorDivide):
                r = x // y
            elif isinstance(op, cst.Power):
                r = x**y
            else:
                return None
        except (ZeroDivisionError, OverflowError):
            return None
        if isinstance(r, float):
            r = float(f"{r:.12g}")
        return Known(r, a.line)

    def _resolve_qual(self, node) -> Optional[str]:
        qs = self.qnames(node)
        if qs:
            return sorted(qs)[0]
        d = dotted(node)
        return d

    def ev_name(self, name: str, scope: Optional[FuncInfo], line: int) -> Ev:
        cur = scope
        while cur is not None:
            if name in cur.assigns:
                return self._combine_or_unpack(cur.assigns, name, cur, line)
            if name in cur.params:
                return self.ev_param(cur, name)
            cur = cur.parent
        globs = self.globals_of(scope)
        if name in globs:
            return self._combine_or_unpack(globs, name, None, line)
        return None

    def globals_of(self, scope: Optional[FuncInfo]) -> dict:
        """Module-level names visible from *scope*: its own file's (a local module's function sees its module)."""
        while scope is not None and scope.parent is not None:
            scope = scope.parent
        if scope is not None and scope.module_globals is not None:
            return scope.module_globals
        return self.module_assigns

    def _combine_or_unpack(self, assigns: dict, name: str, scope, use_line: int = 0) -> Ev:
        exprs = assigns[name]
        if exprs == [None] and (id(assigns), name) in self.unpacks:
            call, index = self.unpacks[(id(assigns), name)]
            return self.ev_unpack(call, index, scope)
        ev = self._combine(exprs, scope)
        if ev is None and len(exprs) > 1 and use_line:
            reaching = self._reaching(exprs, scope, use_line)
            if reaching is not None:
                ev = self.ev(reaching, scope)
        sets = self.item_sets.get((id(assigns), name))
        if sets and isinstance(ev, Known) and isinstance(ev.value, Record) and ev.value.kind == "dict":
            # ``gen_kwargs["max_new_tokens"] = 32`` after the dict literal: the later value wins
            ev = Known(Record("dict", {**ev.value.fields, **sets}, ev.value.line), ev.line)
        return ev

    def _reaching(self, exprs: list, scope, use_line: int):
        """The one assignment of several that reaches a use on *use_line* in straight-line code:
        ``config = AutoConfig.from_pretrained(...)`` ... ``config = PPOConfig(...)`` ...
        ``PPOTrainer(config, ...)`` reads the second. Only when the latest assignment before the use
        is unconditional (directly in the function or module body, not in a branch, loop or try) and
        no other assignment lies after it and before the use; otherwise None."""
        if None in exprs:
            return None
        body_owner = scope.node if scope is not None else None
        placed = []
        for e in exprs:
            ln = self.line(e)
            if not ln or getattr(ln, "file", None) != getattr(use_line, "file", None):
                return None
            placed.append((int(ln), e))
        before = [(ln, e) for ln, e in placed if ln < int(use_line)]
        if not before:
            return None
        ln, e = max(before, key=lambda t: t[0])
        child = e
        for anc in self.ancestors(e):
            if anc is body_owner or anc is self.module:
                break
            if isinstance(anc, cst.If) and "__main__" in _code_of(anc.test):
                child = anc
                continue  # the script's main guard runs unconditionally
            if isinstance(anc, (cst.If, cst.Else)) and self._branch_taken(anc, child, scope):
                child = anc
                continue  # `if args.config: cfg = load(...) else: cfg = DEFAULT`: the test is settled
            if isinstance(anc, _BRANCHING):
                return None
            child = anc
        # an assignment after the use inside a loop around the use may flow back to it
        later = [e2 for ln2, e2 in placed if ln2 >= int(use_line)]
        if later:
            return None
        return e

    def _branch_taken(self, node, child, scope) -> bool:
        """*child* sits in the branch of the ``if`` *node* (or of the ``if`` owning the ``else`` *node*)
        that a statically known test takes; False when the test is not known or takes the other way."""
        if isinstance(node, cst.Else):
            owner = self.parents.get(node)
            return isinstance(owner, cst.If) and self._test_is(owner, scope, False)
        if child is node.orelse:
            return self._test_is(node, scope, False)  # the else / elif branch: this test must be false
        return any(x is child for x in walk(node.body)) and self._test_is(node, scope, True)

    def _test_is(self, node: cst.If, scope, want: bool) -> bool:
        return self.truth(node.test, scope) is want

    def truth(self, test, scope) -> Optional[bool]:
        """The truth value a condition has with the script's own values, or None when it is known only at
        run time. An optional flag without a default is None unless given (``if args.lr: cfg.lr =
        args.lr`` does not run by default)."""
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            t = self.truth(test.expression, scope)
            return None if t is None else not t
        if isinstance(test, cst.BooleanOperation):
            left = self.truth(test.left, scope)
            if isinstance(test.operator, cst.And):
                return False if left is False else (self.truth(test.right, scope) if left is True else
                                                    (False if self.truth(test.right, scope) is False else None))
            return True if left is True else (self.truth(test.right, scope) if left is False else
                                              (True if self.truth(test.right, scope) is True else None))
        if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and \
                isinstance(test.comparisons[0].operator, (cst.Is, cst.IsNot)) and \
                _code_of(test.comparisons[0].comparator) == "None":
            ev = self.ev(test.left, scope)
            is_none = True if isinstance(ev, NoneUnlessGiven) else (
                ev.value is None if isinstance(ev, Known) and not isinstance(ev.value, Record) else None)
            if is_none is None:
                return None
            return is_none if isinstance(test.comparisons[0].operator, cst.Is) else not is_none
        ev = self.ev(test, scope)
        if isinstance(ev, NoneUnlessGiven):
            return False
        if isinstance(ev, Known) and not isinstance(ev.value, Record):
            return bool(ev.value)
        return None

    def dead(self, node, scope, truth=None, stop=(cst.FunctionDef, cst.ClassDef)) -> bool:
        """*node* sits in a branch that the script's own values never take: an enclosing ``if`` (up to the
        first *stop* node) whose test is False for its body or True for its ``else``. *truth* evaluates a
        test (True, False or None when unknown; :meth:`truth` by default)."""
        truth = truth or self.truth
        child = node
        for anc in self.ancestors(node):
            if isinstance(anc, cst.If):
                in_body = child is anc.body
                in_else = anc.orelse is not None and child is anc.orelse
                if in_body or in_else:
                    t = truth(anc.test, scope)
                    if t is not None and ((in_body and t is False) or (in_else and t is True)):
                        return True
            if isinstance(anc, stop):
                return False
            child = anc
        return False

    def ev_unpack(self, call: cst.Call, index: int, scope) -> Ev:
        """``args, ppo_config = HfArgumentParser((ScriptArgs, PPOConfig)).parse_args_into_dataclasses()``:
        the index-th dataclass of the parser (its defaults; the command line may override them).
        ``args, accelerator = parse_args()`` with a helper of the program whose one ``return`` is a
        tuple: the index-th element, evaluated in the helper."""
        if not isinstance(call, cst.Call):
            return None
        if not isinstance(call.func, cst.Attribute) or call.func.attr.value not in (
                "parse_args_into_dataclasses", "parse_yaml_file", "parse_json_file", "parse_args_and_config"):
            t = self.resolve_callee(call, scope)
            if t is not None and t[1] == 0 and t[0].cls is None:
                rets = [n for n in walk(t[0].node.body) if isinstance(n, cst.Return) and n.value is not None
                        and self.func_of(n) is t[0]]
                if len(rets) == 1 and isinstance(rets[0].value, cst.Tuple) and index < len(rets[0].value.elements):
                    return self.ev(rets[0].value.elements[index].value, t[0])
            return None
        recv = call.func.value
        parsers = [recv] if isinstance(recv, cst.Call) else (
            [e for e in self.assignments_of(recv.value, scope) if e is not None] if isinstance(recv, cst.Name) else [])
        if len(parsers) != 1 or not isinstance(parsers[0], cst.Call) or not parsers[0].args:
            return None
        classes = parsers[0].args[0].value
        if not isinstance(classes, (cst.Tuple, cst.List)):
            if index != 0:
                return None
            cls = classes  # HfArgumentParser(ScriptArguments): one dataclass
        elif index >= len(classes.elements):
            return None
        else:
            cls = classes.elements[index].value
        line = self.line(call)
        if isinstance(cls, cst.Name) and cls.value in self.classes and _is_dataclass(self, self.classes[cls.value]):
            return Known(self.dataclass_record(self.classes[cls.value], None, None), line)
        q = self._resolve_qual(cls) or ""
        if q.rsplit(".", 1)[-1].endswith(("Config", "Arguments")):
            return Known(Record(f"call:{q.rsplit('.', 1)[-1]}", {}, line), line)
        return None

    def _combine(self, exprs: list, scope) -> Ev:
        vals = []
        for e in exprs:
            if e is None:
                return None
            vals.append(self.ev(e, scope))
        if not vals:
            return None
        if any(isinstance(v, Runtime) for v in vals):
            return next(v for v in vals if isinstance(v, Runtime))
        if all(isinstance(v, Known) for v in vals):
            first = vals[0]
            if all(_same(v.value, first.value) for v in vals):
                return vals[-1] if len(vals) > 1 else first
        return None

    def ev_param(self, info: FuncInfo, name: str) -> Ev:
        idx, param = info.params[name]
        if param.star in ("*", "**"):
            return None
        sites = self.calls_by_callee().get(info.qual, [])
        # a function also used as a value (callback) has call sites we cannot see, unless every such use
        # is ``functools.partial(f, name=value)`` binding this parameter (the only way it is then called)
        if self._used_as_value(info) or not sites:
            bound = self._partial_binding(info, name)
            if bound is not None:
                return bound
        if self._used_as_value(info):
            sites = None
        vals = []
        if sites:
            for call, caller, offset in sites:
                arg = self._arg_for(call, idx, name, offset)
                if arg == "star":
                    return None
                if arg is None:
                    vals.append(self.ev(param.default, None) if param.default is not None else None)
                else:
                    vals.append(self.ev(arg, caller))
        elif param.default is not None:
            vals.append(self.ev(param.default, info.parent))
        if not vals or any(v is None for v in vals):
            return None
        if any(isinstance(v, Runtime) for v in vals):
            return next(v for v in vals if isinstance(v, Runtime))
        first = vals[0]
        if all(_same(v.value, first.value) for v in vals):
            return first
        return None

    def _partial_binding(self, info: FuncInfo, name: str) -> Ev:
        """The value every ``functools.partial(f, ..., name=v)`` of *info* binds, when the function is used
        as a value only there (and never called directly); None otherwise."""
        if info.cls is not None or self.calls_by_callee().get(info.qual):
            return None
        uses, vals = 0, []
        for node in self.all_nodes():
            if isinstance(node, cst.Name) and node.value == info.name:
                parent = self.parents.get(node)
                if isinstance(parent, (cst.FunctionDef, cst.ImportAlias, cst.AsName)):
                    continue
                uses += 1
            if isinstance(node, cst.Call) and node.args and isinstance(node.args[0].value, cst.Name) and \
                    node.args[0].value.value == info.name and \
                    (self.qnames(node.func) | {dotted(node.func) or ""}) & {"functools.partial", "partial"}:
                kw = [a.value for a in node.args if a.keyword is not None and a.keyword.value == name]
                if len(kw) != 1:
                    return None
                vals.append(self.ev(kw[0], self.func_of(node)))
        if not vals or uses != len(vals) or not all(isinstance(v, Known) for v in vals):
            return None
        return vals[0] if all(_same(v.value, vals[0].value) for v in vals) else None

    def _used_as_value(self, info: FuncInfo) -> bool:
        if info.cls is not None or info.parent is not None:
            return False
        if self._value_uses is None:
            uses = set()
            for node in self.all_nodes():
                if isinstance(node, cst.Name):
                    parent = self.parents.get(node)
                    if isinstance(parent, cst.Call) and parent.func is node:
                        continue
                    if isinstance(parent, (cst.FunctionDef, cst.ImportAlias, cst.AsName)):
                        continue
                    if isinstance(parent, cst.Attribute) and parent.attr is node:
                        grand = self.parents.get(parent)
                        if isinstance(grand, cst.Call) and grand.func is parent:
                            continue  # module.function(...) is a call, not a value
                    uses.add(node.value)
            self._value_uses = uses
        return info.name in self._value_uses

    @staticmethod
    def _arg_for(call: cst.Call, idx: Optional[int], name: str, offset: int):
        pos = 0
        for a in call.args:
            if a.star:
                return "star"
            if a.keyword is not None:
                if a.keyword.value == name:
                    return a.value
                continue
            if idx is not None and pos + offset == idx:
                return a.value
            pos += 1
        return None

    def ev_attr(self, node: cst.Attribute, scope) -> Ev:
        line = self.line(node)
        attr = node.attr.value
        base = node.value
        if isinstance(base, cst.Name) and base.value == "self":
            cls = self.class_of(scope)
            if cls is None:
                return None
            assigns = self.self_assignments(cls, attr)
            if not assigns:
                return None
            vals = []
            for expr, info in assigns:
                if expr is None:
                    return None
                vals.append(self.ev(expr, info))
            if any(v is None for v in vals):
                return None
            if any(isinstance(v, Runtime) for v in vals):
                return next(v for v in vals if isinstance(v, Runtime))
            if all(_same(v.value, vals[0].value) for v in vals):
                return vals[0]
            return None
        q = self._resolve_qual(node)
        if q in RUNTIME_CALLS:
            return None
        rec = self.ev_record(base, scope)
        if rec is not None:
            stored = self._stored_attr(rec, attr, line)
            if stored is not _NOT_STORED:
                return stored
            return self.record_field(rec, attr, line)
        return None

    def attr_stores(self) -> dict:
        """attr -> [(base name, value node | None, FuncInfo | None, line)] for ``x.attr = value``
        anywhere in the program (``args.batch_size = args.micro * world_size`` after parsing)."""
        cache = self.__dict__.get("_attr_stores")
        if cache is not None:
            return cache
        out: dict = {}
        for node in self.all_nodes():
            if isinstance(node, cst.Assign):
                targets, value = [t.target for t in node.targets], node.value
            elif isinstance(node, cst.AnnAssign):
                targets, value = [node.target], node.value
            elif isinstance(node, cst.AugAssign):
                targets, value = [node.target], None
            else:
                continue
            for t in targets:
                if isinstance(t, cst.Attribute) and isinstance(t.value, cst.Name) and t.value.value != "self":
                    out.setdefault(t.attr.value, []).append((t.value.value, value, self.func_of(node), self.line(node)))
                elif isinstance(t, cst.Attribute) and isinstance(t.value, cst.Attribute) and \
                        dotted(t.value) is not None and not dotted(t.value).startswith("self."):
                    # args.ppo.batch_size = ...: a field of a nested record
                    out.setdefault(t.attr.value, []).append((t.value, value, self.func_of(node), self.line(node)))
        self.__dict__["_attr_stores"] = out
        return out

    def _stored_attr(self, rec: Record, attr: str, line: int):
        """A field of a parsed-arguments / dataclass record that the program overwrites after building
        it (``args.batch_size = ...``): the stored value when it is proven, else Runtime naming the
        assignment; _NOT_STORED when nothing overwrites it. Never the record's own (stale) default."""
        if rec.kind == "dict":
            return _NOT_STORED
        hits = []
        for base, value, sc, ln in self.attr_stores().get(attr, []):
            if value is not None and self.dead(value, sc):
                continue  # `if args.lr: cfg.lr = args.lr` with the flag not given
            other = self.ev_record(cst.Name(base) if isinstance(base, str) else base, sc)
            if other is not None and other.kind == rec.kind and other.line == rec.line:
                hits.append((value, sc, ln))
        if not hits:
            return _NOT_STORED
        if len(hits) == 1 and hits[0][1] is not None or (len(hits) == 1 and hits[0][0] is not None):
            value, sc, ln = hits[0]
            if value is not None:
                v = self.ev(value, sc)
                if isinstance(v, Known):
                    return v
                return Runtime(f"{attr} is set at run time: {attr} = {_code_of(value)} (line {ln})", ln)
        return Runtime(f"{attr} is reassigned {len(hits)} time(s) after the arguments are parsed (line "
                       f"{hits[0][2]})", hits[0][2])

    def record_field(self, rec: Record, name: str, line: int) -> Ev:
        if name not in rec.fields and rec.kind in self.derived_fields:
            got = self.derived_fields[rec.kind](self, rec, name, line)
            if got is not None:
                return got
        if name not in rec.fields:
            if rec.missing == "runtime":
                return Runtime(f"args.{name} is not given a default in this file; it comes from the command line", line)
            return None
        val = rec.fields[name]
        if isinstance(val, (Known, Runtime)):
            return val
        expr, sc = val
        return self.ev(expr, sc)

    def ev_call(self, node: cst.Call, scope) -> Ev:
        line = self.line(node)
        q = self._resolve_qual(node.func) or ""
        qs = self.qnames(node.func) | {q}
        for name in qs:
            if self.assume_world_size is not None and (name.endswith(".get_world_size") or
                                                       name.endswith("get_data_parallel_world_size")):
                return Known(self.assume_world_size, line)
            if name in RUNTIME_CALLS or name.endswith(".get_world_size") or name.endswith("get_data_parallel_world_size"):
                return Runtime(f"{dotted(node.func) or name}() is {RUNTIME_CALLS.get(name, 'known only at run time')}", line)
        if qs & {"typer.Option", "typer.Argument", "typer.params.Option", "typer.params.Argument"}:
            # def main(lr: float = typer.Option(1e-5, help=...)): the parameter's default is the first argument
            d = next((a.value for a in node.args if a.keyword is not None and a.keyword.value == "default"), None)
            if d is None and node.args and node.args[0].keyword is None and not node.args[0].star:
                d = node.args[0].value
            if d is None or isinstance(d, cst.Ellipsis):
                return Runtime(f"{dotted(node.func) or q}(...) has no default; its value is set on the command line",
                               line)
            return self.ev(d, scope)
        if isinstance(node.func, cst.Name) and node.func.value in ("float", "int") and len(node.args) == 1:
            v = self.ev(node.args[0].value, scope)
            if isinstance(v, Known) and isinstance(v.value, (int, float, str)):
                try:
                    return Known(type(0.0 if node.func.value == "float" else 0)(v.value), v.line)
                except ValueError:
                    return None
            return v if isinstance(v, Runtime) else None
        if isinstance(node.func, cst.Name) and node.func.value in ("Path", "str", "PurePath") and len(node.args) == 1 \
                or qs & {"pathlib.Path", "os.fspath", "os.path.expanduser"} and len(node.args) == 1:
            v = self.ev(node.args[0].value, scope)  # Path("x") is the path "x"
            return v if isinstance(v, (Known, Runtime)) and (isinstance(v, Runtime) or isinstance(v.value, str)) \
                else None
        if qs & {"yaml.safe_load", "yaml.load", "yaml.full_load", "omegaconf.OmegaConf.load"} and node.args:
            return self.ev_yaml(node.args[0].value, scope, line)
        if isinstance(node.func, cst.Name) and node.func.value == "len":
            return Runtime(f"len(...) at line {line} depends on the data", line)
        if isinstance(node.func, cst.Name) and node.func.value == "dict":
            fields = {}
            for a in node.args:
                if a.keyword is None:
                    return None
                fields[a.keyword.value] = (a.value, scope)
            return Known(Record("dict", fields, line), line)
        if any(n in ARGS_SOURCES for n in qs) or (isinstance(node.func, cst.Name) and node.func.value == "get_args"):
            return Known(self.args_record(), line)
        if isinstance(node.func, cst.Attribute) and node.func.attr.value in ("parse_args", "parse_known_args"):
            rec = self.args_record()
            return Known(rec, line)
        if "tyro.cli" in qs and node.args:
            return self.ev_call(cst.Call(func=node.args[0].value), scope) if isinstance(node.args[0].value, cst.Name) else None
        if isinstance(node.func, cst.Name) and node.func.value in self.classes:
            cdef = self.classes[node.func.value]
            if _is_dataclass(self, cdef):
                return Known(self.dataclass_record(cdef, node, scope), line)
        # keyword-constructed config objects: PPOConfig(...), GRPOConfig(...), SimpleNamespace(...)
        name = q.rsplit(".", 1)[-1]
        if name.endswith("Config") or name in ("SimpleNamespace", "Namespace", "EasyDict", "edict", "SamplingParams"):
            fields = {}
            for a in node.args:
                if a.keyword is not None:
                    fields[a.keyword.value] = (a.value, scope)
                elif a.star == "**":
                    inner = self.ev_record(a.value, scope)
                    if inner is None:
                        return None
                    fields.update(inner.fields)
                else:
                    return None
            return Known(Record(f"call:{name}", fields, line), line)
        # a small arithmetic helper of the program (exact_div(a, b)): evaluated with this call's arguments
        t = self.resolve_callee(node, scope)
        inl = self._ev_inline(t, node, scope) if t is not None else None
        if inl is not None:
            return inl
        # a function of the program with one ``return``: ``args = parse_args()`` returns parser.parse_args()
        if t is not None and t[1] == 0 and t[0].cls is None:
            rets = [n for n in walk(t[0].node.body) if isinstance(n, cst.Return) and n.value is not None
                    and self.func_of(n) is t[0]]
            if len(rets) == 1:
                return self.ev(rets[0].value, t[0])
        return None

    def _ev_inline(self, t, call: cst.Call, scope) -> Ev:
        """A function whose body is only arithmetic assignments to names, checks that raise, and one
        ``return``, evaluated on the Known numbers this call passes; None otherwise. Nothing is run but
        arithmetic on numbers (no call other than min/max/abs/int/float/round)."""
        info, offset = t
        if info.cls is not None or not info.params:
            return None
        env: dict = {}
        for name, (idx, param) in info.params.items():
            if param.star:
                return None
            arg = self._arg_for(call, idx, name, offset)
            if arg == "star":
                return None
            v = self.ev(arg, scope) if arg is not None else (self.ev(param.default, None) if param.default else None)
            if not (isinstance(v, Known) and isinstance(v.value, (int, float)) and not isinstance(v.value, bool)):
                return None
            env[name] = v.value
        safe = {"min": min, "max": max, "abs": abs, "int": int, "float": float, "round": round}

        def arith(e) -> bool:
            for n in walk(e):
                if isinstance(n, cst.Call):
                    if not (isinstance(n.func, cst.Name) and n.func.value in safe):
                        return False
                elif isinstance(n, cst.Name):
                    if n.value not in env and n.value not in safe:
                        return False
                elif not isinstance(n, (cst.BinaryOperation, cst.UnaryOperation, cst.Integer, cst.Float, cst.Arg,
                                        cst.BaseBinaryOp, cst.BaseUnaryOp, cst.LeftParen, cst.RightParen,
                                        cst.Comma, cst.ParenthesizedWhitespace, cst.SimpleWhitespace)):
                    return False
            return True

        body = info.node.body.body if isinstance(info.node.body, cst.IndentedBlock) else []
        for st in body:
            if isinstance(st, cst.If):
                if all(isinstance(x, cst.SimpleStatementLine) and all(isinstance(y, cst.Raise) for y in x.body)
                       for x in st.body.body) and st.orelse is None:
                    continue
                return None
            if not isinstance(st, cst.SimpleStatementLine):
                return None
            for small in st.body:
                if isinstance(small, (cst.Assert, cst.Pass)) or (isinstance(small, cst.Expr) and
                                                                  isinstance(small.value, cst.SimpleString)):
                    continue
                if isinstance(small, cst.Assign) and len(small.targets) == 1 and \
                        isinstance(small.targets[0].target, cst.Name) and arith(small.value):
                    try:
                        env[small.targets[0].target.value] = eval(_code_of(small.value), {"__builtins__": {}}, {**safe, **env})
                    except Exception:
                        return None
                    continue
                if isinstance(small, cst.Return) and small.value is not None and arith(small.value):
                    try:
                        v = eval(_code_of(small.value), {"__builtins__": {}}, {**safe, **env})
                    except Exception:
                        return None
                    return Known(v, self.line(call)) if isinstance(v, (int, float)) else None
                return None
        return None

    def ev_yaml(self, arg, scope, line) -> Ev:
        """``yaml.safe_load(f)`` with ``with open(path) as f`` (or ``open(path)`` / a path for OmegaConf),
        *path* a proven string naming a file of the project (``--config`` defaulting to "config.yaml"):
        the file's mapping, each value with its own line in that file. The file is read, never run."""
        import os

        path_node = arg
        if isinstance(arg, cst.Name):
            path_node = None
            for n, sc in self.nodes_of(cst.WithItem):
                if sc is scope and n.asname is not None and isinstance(n.asname.name, cst.Name) \
                        and n.asname.name.value == arg.value:
                    path_node = n.item
            if path_node is None:
                return None
        if isinstance(path_node, cst.Call) and (dotted(path_node.func) or "") in ("open", "io.open") and path_node.args:
            path_node = path_node.args[0].value
        p = self.ev(path_node, scope)
        if isinstance(p, Runtime):
            return p
        if not (isinstance(p, Known) and isinstance(p.value, str)) or self.source_dir is None:
            return None
        full = p.value if os.path.isabs(p.value) else os.path.join(self.source_dir, p.value)
        try:
            import yaml

            with open(full, "rb") as fh:
                root = yaml.compose(fh)
        except (OSError, ValueError, yaml.YAMLError):
            return Runtime(f"the YAML file {p.value!r} the script loads is not readable here", line)
        rel = os.path.relpath(full, self.source_dir).replace(os.sep, "/")

        def conv(node):
            if isinstance(node, yaml.MappingNode):
                fields = {}
                for k, v in node.value:
                    if isinstance(k, yaml.ScalarNode):
                        fields[k.value] = conv(v)
                return Known(Record("dict", fields, Line(node.start_mark.line + 1, rel)), Line(node.start_mark.line + 1, rel))
            try:
                value = yaml.safe_load(yaml.serialize(node))
            except yaml.YAMLError:
                return None
            if isinstance(value, list):
                value = tuple(value)
            return Known(value, Line(node.start_mark.line + 1, rel))

        out = conv(root) if root is not None else None
        if out is None or not isinstance(out.value, Record):
            return None
        self.__dict__.setdefault("yaml_files", set()).add(rel)
        return out

    def dataclass_record(self, cdef: cst.ClassDef, call: Optional[cst.Call], scope) -> Record:
        fields: dict = {}
        for stmt in cdef.body.body:
            if not isinstance(stmt, cst.SimpleStatementLine):
                continue
            for small in stmt.body:
                if isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name):
                    fname = small.target.value
                    val = small.value
                    if val is None:
                        fields[fname] = Runtime(f"{cdef.name.value}.{fname} has no default", self.line(small))
                        continue
                    if isinstance(val, cst.Call) and dotted(val.func) in ("field", "dataclasses.field"):
                        default = None
                        for a in val.args:
                            if a.keyword is not None and a.keyword.value == "default":
                                default = (a.value, None)
                            elif a.keyword is not None and a.keyword.value == "default_factory":
                                if isinstance(a.value, cst.Name) and a.value.value in self.classes:
                                    sub = self.classes[a.value.value]
                                    fields[fname] = Known(self.dataclass_record(sub, None, None), self.line(a.value))
                                    default = "done"
                        if default is None:
                            fields[fname] = None
                        elif default != "done":
                            fields[fname] = default
                        continue
                    fields[fname] = (val, None)
        if call is not None:
            for a in call.args:
                if a.keyword is not None:
                    fields[a.keyword.value] = (a.value, scope)
        fields = {k: v for k, v in fields.items() if v is not None}
        return Record(f"dataclass:{cdef.name.value}", fields, self.line(cdef))

    def args_record(self) -> Record:
        """All argparse flags declared in this file plus Megatron-LM ``args_defaults``."""
        if self._args_record is not None:
            return self._args_record
        fields: dict = {}
        for node in self.all_nodes():
            if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Attribute):
                continue
            meth = node.func.attr.value
            if meth == "add_argument":
                dest = None
                for a in node.args:
                    if a.keyword is not None and a.keyword.value == "dest":
                        v = self.ev(a.value, None)
                        dest = v.value if isinstance(v, Known) else None
                if dest is None:
                    flags = [a.value for a in node.args if a.keyword is None and isinstance(a.value, cst.SimpleString)]
                    names = [literal_value(f) for f in flags]
                    longs = [n for n in names if n.startswith("--")]
                    pick = longs[0] if longs else (names[0] if names else None)
                    if pick is None:
                        continue
                    dest = pick.lstrip("-").replace("-", "_")
                kw = {a.keyword.value: a.value for a in node.args if a.keyword is not None}
                line = self.line(node)
                if "default" in kw:
                    fields[dest] = (kw["default"], self.func_of(node))
                elif "action" in kw and isinstance(kw["action"], cst.SimpleString):
                    action = literal_value(kw["action"])
                    if action == "store_true":
                        fields[dest] = Known(False, line)
                    elif action == "store_false":
                        fields[dest] = Known(True, line)
                    else:
                        fields[dest] = Runtime(f"--{dest.replace('_', '-')} (line {line}) has no default", line)
                else:
                    required = "required" in kw and _code_of(kw["required"]) == "True"
                    positional = not any(isinstance(a.value, cst.SimpleString) and literal_value(a.value).startswith("-")
                                         for a in node.args if a.keyword is None)
                    kind = Runtime if required or positional else NoneUnlessGiven
                    fields[dest] = kind(f"--{dest.replace('_', '-')} (line {line}) has no default; its value is set on the command line", line)
            elif meth == "set_defaults":
                for a in node.args:
                    if a.keyword is not None:
                        fields[a.keyword.value] = (a.value, self.func_of(node))
        # Megatron-LM: initialize_megatron(args_defaults={...}) overrides parser defaults
        for node in self.all_nodes():
            if isinstance(node, cst.Call):
                for a in node.args:
                    if a.keyword is not None and a.keyword.value == "args_defaults":
                        rec = self.ev_record(a.value, self.func_of(node))
                        if rec is not None:
                            fields.update(rec.fields)
        self._args_record = Record("args", fields, 0, missing="runtime")
        return self._args_record


_NOT_STORED = object()


def _code_of(node) -> str:
    return cst.Module(body=[]).code_for_node(node).strip()


_BRANCHING = tuple(t for t in (cst.If, cst.For, cst.While, cst.Try, getattr(cst, "TryStar", None), cst.FunctionDef,
                                cst.ClassDef, cst.Lambda, cst.CompFor, getattr(cst, "Match", None)) if t is not None)


def _same(a, b) -> bool:
    if isinstance(a, Record) or isinstance(b, Record):
        return a is b
    return type(a) is type(b) and a == b or (
        isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) and a == b
    )


def _is_dataclass(prog: Program, cdef: cst.ClassDef) -> bool:
    for d in cdef.decorators:
        expr = d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator
        if (dotted(expr) or "").split(".")[-1] == "dataclass":
            return True
    return False
