"""Shared pieces of the recogniser: the Analysis result, AST helpers, the name patterns it uses.

Everything is decided by how a value is *used*, never by the name it has: the value inside
``torch.clamp(ratio, 1 - x, 1 + x)`` is the clip ratio, the factor multiplying a KL term that is
subtracted from the rewards is the KL coefficient (placement ``reward``), the ``lr`` that reaches
``torch.optim.AdamW`` is the actor learning rate, the ``range(n)`` loop between the rollout and the
minibatch loop is the number of PPO epochs, and so on.

The result is an :class:`Analysis`: ``status`` (``migrate`` | ``refuse`` | ``unchanged``),
``reasons`` (why it refuses), ``warnings``, ``config`` (dotted key -> value) and ``provenance``
(dotted key -> line). Refusal is the default whenever the structure is not certain.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Optional

import libcst as cst

from .._static import FuncInfo, Known, Program, Record, Runtime, dotted, walk

GEN_RE = re.compile(r"^(generate\w*|\w+_generate\w*|sample|sample_\w+|\w+_sample|rollout\w*|\w+_rollout\w*|multinomial)$")
REWARD_RE = re.compile(r"reward|score|verif|judge|correct|accuracy", re.I)
REF_NAME_RE = re.compile(r"(^|_)(ref|reference|init|initial|sft|base|frozen)(_|$|model|policy|logp|log)", re.I)
OLD_NAME_RE = re.compile(r"(^|_)(old|prev|previous|behav\w*|rollout)(_|$)", re.I)
LOSS_RE = re.compile(r"loss|objective|obj$", re.I)
VALUE_LOSS_RE = re.compile(r"(^|_)(v|vf|value|values|critic)_?(loss|err|error)|value_loss|critic_loss|vf_loss", re.I)
ENTROPY_RE = re.compile(r"entrop|(^|_)ent($|_)", re.I)
OPTIMIZERS = ("Adam", "AdamW", "SGD", "RMSprop", "Adagrad", "FusedAdam", "DeepSpeedCPUAdam", "Adafactor", "Lion")
SCHEDULER_RE = re.compile(r"lr_scheduler|Scheduler$|get_\w*schedule\w*|OptimizerParamScheduler|CosineAnnealing|LambdaLR|StepLR")
TRAINER_QNAMES = ("verl_bridge.MegatronTrainer", "verl_bridge.runtime.MegatronTrainer")


@dataclass
class Analysis:
    status: str = "refuse"
    reasons: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    config: dict = field(default_factory=dict)
    provenance: dict = field(default_factory=dict)
    entry: Optional[FuncInfo] = None
    reward_todo: Optional[str] = None
    imports_used_by_entry: set = field(default_factory=set)
    # block rewrite: ("module" | "main", index of the loop statement, indexes of removed statements)
    block: Optional[tuple] = None
    removed_defs: list = field(default_factory=list)  # module-body indexes of definitions that held the loop
    defaults_used: dict = field(default_factory=dict)
    unmapped: list = field(default_factory=list)
    # key -> {"flag", "from", "placeholder"}: the command line must supply it (no default in the script)
    to_fill: dict = field(default_factory=dict)

    def refuse(self, reason: str) -> "Analysis":
        self.status = "refuse"
        if reason not in self.reasons:
            self.reasons.append(reason)
        return self

    def warn(self, msg: str) -> None:
        if msg not in self.warnings:
            self.warnings.append(msg)


def _last(node: cst.BaseExpression) -> Optional[str]:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return node.attr.value
    return None


def _names_in(node: cst.CSTNode) -> list[str]:
    out = []
    for n in walk(node):
        if isinstance(n, cst.Name):
            out.append(n.value)
        elif isinstance(n, cst.Attribute):
            out.append(n.attr.value)
    return out


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node).strip()


def _is_one(node) -> bool:
    return isinstance(node, (cst.Integer, cst.Float)) and float(node.value) == 1.0


def _call_arg(call: cst.Call, index: int, name: str):
    pos = 0
    for a in call.args:
        if a.keyword is not None:
            if a.keyword.value == name:
                return a.value
            continue
        if a.star:
            return None
        if pos == index:
            return a.value
        pos += 1
    return None


def _kwarg(call: cst.Call, name: str):
    for a in call.args:
        if a.keyword is not None and a.keyword.value == name:
            return a.value
    return None


class RecognizerBase:
    def __init__(self, prog: Program, module_name: str):
        self.p = prog
        self.module_name = module_name
        self.a = Analysis()
        self.calls: list[tuple[cst.Call, Optional[FuncInfo]]] = []
        self.loops: list[cst.CSTNode] = []
        self.calls = list(prog.nodes_of(cst.Call))
        own = prog._own_parents
        # training loops live in the script itself, not in the local modules it imports
        self.loops = [n for n, _ in prog.nodes_of(cst.For, cst.While) if n in own]
        # loops of the local modules it imports: followed when the script's own loops train nothing
        # (the script builds a trainer object of a local class and calls its method: GRPO(...).train())
        self.module_loops = [n for n, _ in prog.nodes_of(cst.For, cst.While) if n not in own]
        self._reach: dict = {}
        self.framework_defaults: dict = {}  # key -> where the default comes from
        self.framework_records: list = []  # (name, Record) of framework config objects

    # ------------------------------------------------------------------ helpers
    def settled_runs(self, stmt, body, info) -> Optional[bool]:
        """True when *stmt* runs whenever *body* does (every ``if`` between them is settled its way, no
        function definition between them), False when it does not, None when a test is known only at run time."""
        child = stmt
        for anc in self.p.ancestors(stmt):
            if anc is body:
                return True
            if isinstance(anc, cst.If):
                t = anc.test
                ev = self.p.ev_param(info, t.value) if isinstance(t, cst.Name) and info is not None and \
                    t.value in info.params else self.p.ev(t, info)
                if not isinstance(ev, Known):
                    return None
                in_body = any(x is child for x in walk(anc.body))
                if bool(ev.value) != in_body:
                    return False
            if isinstance(anc, cst.FunctionDef) and anc is not body:
                return False
            child = anc
        return True

    def fname(self) -> str:
        return self.p.filename

    def loc(self, line: int) -> str:
        return f"{getattr(line, 'file', None) or self.fname()}:{line}"

    def qn(self, node) -> set[str]:
        qs = self.p.qnames(node)
        d = dotted(node)
        if d:
            qs = qs | {d}
        return qs

    def func_nodes(self, *types) -> list:
        """``(node, FuncInfo)`` for nodes of these types inside functions (script and local modules)."""
        return [(n, f) for n, f in self.p.nodes_of(*types) if f is not None]

    def emit_default(self, key: str, value, source: str) -> None:
        """A value the script leaves to its framework's default (named in *source*, e.g. TRL's PPOConfig)."""
        if key in self.a.config:
            return
        self.a.config[key] = value
        self.a.provenance[key] = source
        self.framework_defaults[key] = source

    def emit(self, key: str, ev, what: str = "") -> None:
        """Put a proven value into the config, or explain in a warning why it stays out."""
        if isinstance(ev, Known):
            if key in self.a.config and self.a.config[key] != ev.value:
                self.a.warn(f"{key}: two different values reach the same place ({self.a.config[key]!r} at "
                            f"{self.a.provenance[key]} and {ev.value!r} at {self.loc(ev.line)}); the first is kept")
                return
            if isinstance(ev.value, Record):
                return
            if ev.value is None and _none_not_allowed(key):
                # ``save_freq: Optional[int] = None`` (no checkpoints): the key keeps verl-bridge's default
                self.a.warn(f"{key} is left out: the script's value is None ({self.loc(ev.line)}), which "
                            "switches the feature off there; verl-bridge's default applies")
                return
            self.a.config.setdefault(key, ev.value)
            self.a.provenance.setdefault(key, self.loc(ev.line))
        elif isinstance(ev, Runtime):
            self.a.warn(f"{key} is left out: {ev.why} ({self.loc(ev.line)})")
            # the report's unmapped list names it with the expression it is computed from
            self.__dict__.setdefault("runtime_left", {}).setdefault(key, f"{key}=<run time: {ev.why}> ({self.loc(ev.line)})")
        else:
            if what:
                self.a.warn(f"{key} is left out: {what} is not a static value")


_MISSING = object()


def _none_not_allowed(key: str) -> bool:
    """The config contract has a non-None default for *key* (so None is not a value it takes)."""
    try:
        from .report import schema_default
        return schema_default(key) is not None
    except AttributeError:
        return False


def _factors(node) -> list:
    """The factors of a product ``a * b * c``, left to right (no recursion)."""
    out, stack = [], [node]
    while stack:
        cur = stack.pop()
        if isinstance(cur, cst.BinaryOperation) and isinstance(cur.operator, cst.Multiply):
            stack.append(cur.right)
            stack.append(cur.left)
        else:
            out.append(cur)
    return out


def _find_modulo(test):
    for n in walk(test):
        if isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Modulo):
            return n.right
    return None
