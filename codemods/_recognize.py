"""Recognise a hand-written PPO/GRPO loop and extract the hyperparameters it proves.

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

from ._static import FuncInfo, Known, Program, Record, Runtime, dotted, walk

GEN_RE = re.compile(r"^(generate\w*|\w+_generate\w*|sample|sample_\w+|\w+_sample|rollout\w*|\w+_rollout\w*|multinomial)$")
REWARD_RE = re.compile(r"reward|score|verif|judge|correct|accuracy", re.I)
REF_NAME_RE = re.compile(r"(^|_)(ref|reference|init|initial|sft|base|frozen)(_|$|model|policy|logp|log)", re.I)
OLD_NAME_RE = re.compile(r"(^|_)(old|prev|previous|behav\w*|rollout)(_|$)", re.I)
LOSS_RE = re.compile(r"loss|objective|obj$", re.I)
VALUE_LOSS_RE = re.compile(r"(^|_)(v|vf|value|values|critic)_?(loss|err|error)|value_loss|critic_loss|vf_loss", re.I)
ENTROPY_RE = re.compile(r"entrop|(^|_)ent($|_)", re.I)
OPTIMIZERS = ("Adam", "AdamW", "SGD", "RMSprop", "Adagrad", "FusedAdam", "DeepSpeedCPUAdam", "Adafactor", "Lion")
FRAMEWORK_ENTRY_RE = re.compile(r"ppo|grpo|rlhf|train|fit|learn|run_rl", re.I)
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

    def refuse(self, reason: str) -> "Analysis":
        self.status = "refuse"
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


class Recognizer:
    def __init__(self, prog: Program, module_name: str):
        self.p = prog
        self.module_name = module_name
        self.a = Analysis()
        self.calls: list[tuple[cst.Call, Optional[FuncInfo]]] = []
        self.loops: list[cst.CSTNode] = []
        for node in walk(prog.module):
            if isinstance(node, cst.Call):
                self.calls.append((node, prog.func_of(node)))
            elif isinstance(node, (cst.For, cst.While)):
                self.loops.append(node)
        self._reach: dict = {}

    # ------------------------------------------------------------------ helpers
    def fname(self) -> str:
        return self.p.filename

    def loc(self, line: int) -> str:
        return f"{self.fname()}:{line}"

    def qn(self, node) -> set[str]:
        qs = self.p.qnames(node)
        d = dotted(node)
        if d:
            qs = qs | {d}
        return qs

    def emit(self, key: str, ev, what: str = "") -> None:
        """Put a proven value into the config, or explain in a warning why it stays out."""
        if isinstance(ev, Known):
            if key in self.a.config and self.a.config[key] != ev.value:
                self.a.warn(f"{key}: two different values reach the same place ({self.a.config[key]!r} at "
                            f"{self.a.provenance[key]} and {ev.value!r} at {self.loc(ev.line)}); the first is kept")
                return
            if isinstance(ev.value, Record):
                return
            self.a.config.setdefault(key, ev.value)
            self.a.provenance.setdefault(key, self.loc(ev.line))
        elif isinstance(ev, Runtime):
            self.a.warn(f"{key} is left out: {ev.why} ({self.loc(ev.line)})")
        else:
            if what:
                self.a.warn(f"{key} is left out: {what} is not a static value")

    # --------------------------------------------------------------- reachability
    def direct_callees(self, scope_node: cst.CSTNode) -> list[FuncInfo]:
        out = []
        for n in walk(scope_node):
            if isinstance(n, cst.Call):
                t = self.p.resolve_callee(n, self.p.func_of(n))
                if t is not None:
                    out.append(t[0])
        return out

    def reach(self, node: cst.CSTNode) -> set[str]:
        """Feature tags found under *node* or in file functions it calls (transitively)."""
        key = id(node)
        if key in self._reach:
            return self._reach[key]
        self._reach[key] = set()
        tags: set[str] = set()
        for n in walk(node):
            if isinstance(n, cst.Call):
                tags |= self.call_tags(n)
                t = self.p.resolve_callee(n, self.p.func_of(n))
                if t is not None and t[0].node is not node:
                    tags |= self.reach(t[0].node)
        self._reach[key] = tags
        return tags

    def call_tags(self, call: cst.Call) -> set[str]:
        tags = set()
        last = _last(call.func) or ""
        qs = self.qn(call.func)
        if GEN_RE.match(last) or any(q.endswith("Categorical") for q in qs):
            if not any(q.startswith("random.") or q.startswith("numpy.random") for q in qs):
                tags.add("gen")
        if last == "backward":
            tags.add("backward")
        if last == "step" and self.is_trl_trainer(call.func.value if isinstance(call.func, cst.Attribute) else None, call):
            tags.add("trl_step")
        if self.is_fwd_bwd(call) and not self.forward_only(call):
            tags.add("backward")
        return tags

    def is_fwd_bwd(self, call: cst.Call) -> bool:
        if isinstance(call.func, cst.Name):
            exprs = self.p.assignments_of(call.func.value, self.p.func_of(call))
            return any(isinstance(e, cst.Call) and (_last(e.func) or "") == "get_forward_backward_func" for e in exprs)
        if isinstance(call.func, cst.Call) and (_last(call.func.func) or "") == "get_forward_backward_func":
            return True
        return False

    def forward_only(self, call: cst.Call) -> bool:
        v = _kwarg(call, "forward_only")
        if v is None:
            return False
        ev = self.p.ev(v, self.p.func_of(call))
        return isinstance(ev, Known) and bool(ev.value)

    def is_trl_trainer(self, recv, call) -> bool:
        if recv is None:
            return False
        exprs = []
        if isinstance(recv, cst.Name):
            exprs = self.p.assignments_of(recv.value, self.p.func_of(call))
        for e in exprs:
            if isinstance(e, cst.Call):
                qs = self.qn(e.func)
                if any(q.startswith("trl") and q.endswith("PPOTrainer") for q in qs):
                    return True
        return False

    # ------------------------------------------------------------------ main entry
    def run(self) -> Analysis:
        a = self.a
        trainer_calls = [c for c, _ in self.calls if self.qn(c.func) & set(TRAINER_QNAMES)]
        main_loop = self.find_main_loop()
        if trainer_calls:
            if main_loop is not None:
                return a.refuse("the file already calls MegatronTrainer but still has its own training loop "
                                f"({self.loc(self.p.line(main_loop))}); finish the migration by hand")
            a.status = "unchanged"
            return a
        if main_loop is None:
            return self.refuse_no_loop()
        func = self.p.func_of(main_loop)
        if func is None:
            return a.refuse(f"the training loop runs at module level ({self.loc(self.p.line(main_loop))}); "
                            "move it into a function (for example main()) and run migrate again")
        tags = self.reach(main_loop)
        trl = "trl_step" in tags
        self.main_loop = main_loop
        self.loop_func = func
        if not trl and not self.ratio_clips():
            return a.refuse(
                f"the loop at {self.loc(self.p.line(main_loop))} generates and updates the model but has no "
                "clipped probability ratio (torch.clamp(ratio, 1 - eps, 1 + eps)): it is not a PPO/GRPO loop "
                "that can be mapped with certainty")
        entry = self.find_entry(func)
        if entry is None:
            return a.refuse(f"cannot tell which function runs the training loop at {self.loc(self.p.line(main_loop))}")
        a.entry = entry
        if trl:
            self.extract_trl()
        else:
            self.extract_own()
        self.extract_common(trl)
        if a.reasons:
            a.status = "refuse"
            return a
        a.status = "migrate"
        return a

    def refuse_no_loop(self) -> Analysis:
        a = self.a
        # a framework entry point doing the work: hook-style scripts
        for call, scope in self.calls:
            last = _last(call.func) or ""
            if self.p.resolve_callee(call, scope) is not None:
                continue
            qs = self.qn(call.func)
            imported = any(q.split(".")[0] in self.p.imports or "." in q for q in qs) or (
                isinstance(call.func, cst.Name) and call.func.value in self.p.imports)
            if imported and FRAMEWORK_ENTRY_RE.search(last) and last not in ("train", "eval") or (
                    last in ("train", "fit", "learn") and isinstance(call.func, cst.Attribute) and scope is not None
                    and not call.args and self._recv_is_framework(call, scope)):
                q = self.p._resolve_qual(call.func)
                return a.refuse(
                    f"no training loop of its own: training runs inside {q}() ({self.loc(self.p.line(call))}); "
                    "the script only provides hooks, point MegatronTrainer's config at them instead")
        text = self.p.module.code
        if re.search(r"\bppo\b|\bgrpo\b|rlhf|PPO|GRPO", text):
            return a.refuse("not an RL training loop: the file mentions PPO/GRPO but no loop generates "
                            "responses and then updates the policy from them")
        return a.refuse("no PPO/GRPO training loop found (no loop both generates responses and updates a model)")

    def _recv_is_framework(self, call, scope) -> bool:
        recv = call.func.value
        if isinstance(recv, cst.Name):
            for e in self.p.assignments_of(recv.value, scope):
                if isinstance(e, cst.Call) and self.p.resolve_callee(e, scope) is None:
                    qs = self.qn(e.func)
                    if any("." in q or q.split(".")[0] in self.p.imports for q in qs):
                        return True
        return False

    def find_main_loop(self):
        cands = []
        for loop in self.loops:
            tags = self.reach(loop)
            if ("gen" in tags and "backward" in tags) or "trl_step" in tags:
                cands.append(loop)
        outer = []
        for loop in cands:
            if not any(anc in cands for anc in self.p.ancestors(loop) if isinstance(anc, (cst.For, cst.While))):
                outer.append(loop)
        if not outer:
            return None
        # prefer a loop in a function that is not itself reached from another candidate's function
        funcs = {id(self.p.func_of(l)): l for l in outer}
        for loop in outer:
            f = self.p.func_of(loop)
            called_from_other = False
            for other in outer:
                if other is loop:
                    continue
                if f is not None and any(c.node is f.node for c in self.callees_closure(other)):
                    called_from_other = True
            if not called_from_other:
                return loop
        return outer[0] if funcs else None

    def callees_closure(self, node) -> list[FuncInfo]:
        seen: dict[int, FuncInfo] = {}
        todo = [node]
        while todo:
            cur = todo.pop()
            for f in self.direct_callees(cur):
                if id(f.node) not in seen:
                    seen[id(f.node)] = f
                    todo.append(f.node.body)
        return list(seen.values())

    def find_entry(self, func: FuncInfo) -> Optional[FuncInfo]:
        """The function whose body becomes the trainer call: the one ``__main__`` runs that reaches *func*."""
        top = func
        while top.parent is not None:
            top = top.parent
        main_calls = []
        for stmt in self.p.module.body:
            if isinstance(stmt, cst.If) and "__main__" in _code(stmt.test):
                for n in walk(stmt.body):
                    if isinstance(n, cst.Call):
                        t = self.p.resolve_callee(n, None)
                        if t is not None:
                            main_calls.append(t[0])
        for f in main_calls:
            if f.node is top.node or any(c.node is top.node for c in self.callees_closure(f.node.body)):
                return f if f.cls is None else None
        callers = self.p.calls_by_callee()
        cur = top
        seen = set()
        while cur.qual in callers and cur.qual not in seen:
            seen.add(cur.qual)
            sites = callers[cur.qual]
            outers = {id(c[1].node): c[1] for c in sites if c[1] is not None}
            if len(outers) != 1:
                break
            nxt = next(iter(outers.values()))
            while nxt.parent is not None:
                nxt = nxt.parent
            cur = nxt
        if cur.cls is not None:
            return None
        return cur

    # ------------------------------------------------------------------ ratio clip
    def ratio_clips(self) -> list:
        out = []
        for call, scope in self.calls:
            last = _last(call.func)
            if last not in ("clamp", "clip", "clamp_", "clip_"):
                continue
            if isinstance(call.func, cst.Attribute) and self.qn(call.func) & {"torch.clamp", "torch.clip"}:
                x, lo, hi = _call_arg(call, 0, "input"), _call_arg(call, 1, "min"), _call_arg(call, 2, "max")
            elif isinstance(call.func, cst.Name):
                x, lo, hi = _call_arg(call, 0, "input"), _call_arg(call, 1, "min"), _call_arg(call, 2, "max")
            else:
                x, lo, hi = call.func.value, _call_arg(call, 0, "min"), _call_arg(call, 1, "max")
            if lo is None or hi is None:
                continue
            if (isinstance(lo, cst.BinaryOperation) and isinstance(lo.operator, cst.Subtract) and _is_one(lo.left)
                    and isinstance(hi, cst.BinaryOperation) and isinstance(hi.operator, cst.Add) and _is_one(hi.left)):
                out.append(("ratio", call, scope, x, lo.right, hi.right))
            elif (isinstance(lo, cst.UnaryOperation) and isinstance(lo.operator, cst.Minus)):
                out.append(("sym", call, scope, x, lo.expression, hi))
            elif (isinstance(lo, cst.BinaryOperation) and isinstance(lo.operator, cst.Subtract)
                  and isinstance(hi, cst.BinaryOperation) and isinstance(hi.operator, cst.Add)
                  and _code(lo.left) == _code(hi.left)):
                out.append(("around", call, scope, x, lo.right, hi.right))
        return [c for c in out if c[0] == "ratio"] if not hasattr(self, "_all_clips") else out

    def all_clips(self) -> list:
        self._all_clips = True
        try:
            return self.ratio_clips()
        finally:
            del self._all_clips

    # ------------------------------------------------------------------ own loops
    def extract_own(self) -> None:
        a = self.a
        # clip ratio
        lows, highs = [], []
        for kind, call, scope, x, lo, hi in self.all_clips():
            if kind == "ratio":
                lows.append(self.p.ev(lo, scope))
                highs.append(self.p.ev(hi, scope))
            elif kind in ("sym", "around"):
                names = " ".join(_names_in(x)).lower()
                if kind == "around" or re.search(r"value|vpred|v_|values|critic", names) or isinstance(x, cst.BinaryOperation):
                    if re.search(r"reward|score", names):
                        a.warn(f"reward clipping at {self.loc(self.p.line(call))} is not supported by MegatronTrainer; "
                               "rewards will not be clipped")
                    else:
                        self.emit("algorithm.value_clip", self.p.ev(lo, scope), "the value clip range")
                elif re.search(r"reward|score", names):
                    a.warn(f"reward clipping at {self.loc(self.p.line(call))} is not supported by MegatronTrainer; "
                           "rewards will not be clipped")
        if lows:
            lo, hi = lows[0], highs[0]
            if isinstance(lo, Known) and isinstance(hi, Known) and lo.value != hi.value:
                self.emit("algorithm.clip_ratio_low", lo)
                self.emit("algorithm.clip_ratio_high", hi)
            else:
                self.emit("algorithm.clip_ratio", lo, "the ratio clip range")
        self.extract_kl()
        self.extract_advantages()
        self.extract_loss_coefs()
        self.extract_loop_shape()

    # ------------------------------------------------------------------ KL
    def kl_sites(self):
        """(target name, value expr, scope, assignment node) for assignments that compute a KL term."""
        out = []
        for info in list(self.p.funcs.values()) + [None]:
            assigns = info.assigns if info is not None else self.p.module_assigns
            for name, exprs in assigns.items():
                if "kl" not in name.lower():
                    continue
                for e in exprs:
                    if e is not None and not isinstance(e, (cst.Integer, cst.Float)):
                        out.append((name, e, info))
        return out

    def extract_kl(self) -> None:
        a = self.a
        penalty_found = False
        for name, expr, scope in self.kl_sites():
            uses = self.kl_uses(name, scope)
            early = [u for u in uses if u[0] == "compare"]
            for _, node, _c in early:
                a.warn(f"early stopping on KL ({self.loc(self.p.line(node))}) is not supported by MegatronTrainer; "
                       "training will not stop early")
            penalty = [u for u in uses if u[0] in ("reward", "loss")]
            # DeepSpeed-Chat style: the coefficient is inside the KL expression itself
            inline = self._inline_coef(expr, scope)
            if not penalty and inline is not None and re.search(r"reward|score", " ".join(_names_in(expr)) + name, re.I):
                penalty = [("reward", expr, inline)]
            if not penalty and inline is not None and self._flows_into_rewards(name, scope):
                penalty = [("reward", expr, inline)]
            if not penalty:
                continue
            penalty_found = True
            kind, node, coef = penalty[0]
            ref_side = self.kl_reference(expr, scope)
            if ref_side == "old":
                a.refuse(f"the KL term at {self.loc(self.p.line(expr))} is measured against the old policy "
                         "(the same model before the update), not against a frozen reference model; "
                         "MegatronTrainer's KL penalty means something different")
                return
            if ref_side != "ref":
                a.refuse(f"cannot tell what the KL term at {self.loc(self.p.line(expr))} is measured against "
                         "(a frozen reference model or the old policy)")
                return
            self.emit("algorithm.kl.placement", Known(kind, self.p.line(node)))
            if coef is not None:
                self.emit("algorithm.kl.coef", self.kl_coef_value(coef, scope if kind != "inline" else scope), "the KL coefficient")
            est = self.kl_estimator(expr, scope)
            if est:
                self.emit("algorithm.kl.estimator", Known(est, self.p.line(expr)))
            else:
                a.warn(f"algorithm.kl.estimator is left out: cannot tell which estimator {_code(expr)[:60]} is")
            break
        if not penalty_found:
            penalty_found = self._inline_kl()
        if not penalty_found and not a.reasons:
            self.emit("algorithm.kl.coef", Known(0.0, self.p.line(self.main_loop)))
            a.warn("no KL penalty against a reference model was found; algorithm.kl.coef is set to 0.0")

    def _inline_kl(self) -> bool:
        """``rewards = scores - coef * (logp - ref_logp)``: a KL term written inline in a reward or loss."""
        a = self.a
        for info in self.p.funcs.values():
            for node in walk(info.node.body):
                if not isinstance(node, (cst.Assign, cst.AugAssign)):
                    continue
                tgt = _code(node.targets[0].target if isinstance(node, cst.Assign) else node.target)
                placement = "reward" if re.search(r"reward|score", tgt, re.I) else ("loss" if LOSS_RE.search(tgt) else None)
                if placement is None:
                    continue
                for n in walk(node.value):
                    if not (isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Multiply)):
                        continue
                    for c, other in ((n.left, n.right), (n.right, n.left)):
                        if not (isinstance(other, cst.BinaryOperation) and isinstance(other.operator, cst.Subtract)):
                            continue
                        if not re.search(r"log|lp", _code(other.left), re.I) or not re.search(r"log|lp", _code(other.right), re.I):
                            continue
                        ref_side = self.kl_reference(other, info)
                        if ref_side == "old":
                            a.refuse(f"the KL term at {self.loc(self.p.line(other))} is measured against the old policy "
                                     "(the same model before the update), not against a frozen reference model; "
                                     "MegatronTrainer's KL penalty means something different")
                            return True
                        if ref_side != "ref":
                            a.refuse(f"cannot tell what the KL term at {self.loc(self.p.line(other))} is measured against "
                                     "(a frozen reference model or the old policy)")
                            return True
                        self.emit("algorithm.kl.placement", Known(placement, self.p.line(node)))
                        self.emit("algorithm.kl.coef", self.kl_coef_value(c, info), "the KL coefficient")
                        self.emit("algorithm.kl.estimator", Known("k1", self.p.line(other)))
                        return True
        return False

    def _flows_into_rewards(self, name, scope) -> bool:
        if scope is None:
            return False
        for node in walk(scope.node.body):
            if isinstance(node, (cst.Assign, cst.AugAssign)):
                tgt = node.targets[0].target if isinstance(node, cst.Assign) else node.target
                if re.search(r"reward|score", _code(tgt), re.I) and name in _names_in(node.value):
                    return True
            if isinstance(node, cst.Return) and node.value is not None and name in _names_in(node.value):
                return bool(re.search(r"reward", scope.name, re.I))
        return False

    def _inline_coef(self, expr, scope):
        """Coefficient multiplied into the KL expression itself: ``-kl_ctl * (logp - ref)``."""
        node = expr
        if isinstance(node, cst.UnaryOperation):
            node = node.expression
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
            for c, other in ((node.left, node.right), (node.right, node.left)):
                if isinstance(other, cst.BinaryOperation) and isinstance(other.operator, cst.Subtract):
                    if not isinstance(c, cst.BinaryOperation):
                        return c
        return None

    def kl_uses(self, name: str, scope):
        """How a KL variable is used: ('reward'|'loss', node, coef expr) or ('compare', node, None)."""
        out = []
        body = scope.node.body if scope is not None else self.p.module
        for node in walk(body):
            if isinstance(node, cst.Comparison) and name in [n for n in _names_in(node) ]:
                if isinstance(node.left, (cst.Name, cst.Attribute, cst.Call)) and name in _names_in(node.left):
                    out.append(("compare", node, None))
                    continue
            if isinstance(node, (cst.Assign, cst.AugAssign)):
                value = node.value
                tgt = node.targets[0].target if isinstance(node, cst.Assign) else node.target
                tgt_code = _code(tgt)
                if name in _names_in(tgt):
                    continue
                coef = self._coef_of(value, name)
                if coef is _MISSING:
                    continue
                names = " ".join(_names_in(value)) + " " + tgt_code
                if re.search(r"reward|score|return", tgt_code, re.I) or (
                        re.search(r"reward|score", names, re.I) and not LOSS_RE.search(tgt_code)):
                    out.append(("reward", node, coef))
                elif LOSS_RE.search(tgt_code) or LOSS_RE.search(names):
                    out.append(("loss", node, coef))
            elif isinstance(node, cst.Return) and node.value is not None and scope is not None:
                coef = self._coef_of(node.value, name)
                if coef is not _MISSING and coef is not None:
                    if LOSS_RE.search(scope.name):
                        out.append(("loss", node, coef))
                    elif re.search(r"reward", scope.name, re.I):
                        out.append(("reward", node, coef))
        return out

    def _coef_of(self, value, name):
        """Factor multiplying Name(name) inside a sum in *value*; None if used bare; _MISSING if absent."""
        for n in walk(value):
            if isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Multiply):
                for c, other in ((n.left, n.right), (n.right, n.left)):
                    if self._is_kl_ref(other, name):
                        return c
        for n in walk(value):
            if isinstance(n, cst.BinaryOperation) and isinstance(n.operator, (cst.Add, cst.Subtract)):
                if self._is_kl_ref(n.left, name) or self._is_kl_ref(n.right, name):
                    return None
        return _MISSING

    @staticmethod
    def _is_kl_ref(node, name) -> bool:
        if isinstance(node, cst.Name) and node.value == name:
            return True
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in ("mean", "sum"):
            return Recognizer._is_kl_ref(node.func.value, name)
        if isinstance(node, cst.Subscript):
            return Recognizer._is_kl_ref(node.value, name)
        if isinstance(node, cst.Call) and _last(node.func) in ("masked_mean", "mean", "sum") and node.args:
            return Recognizer._is_kl_ref(node.args[0].value, name)
        return False

    def kl_coef_value(self, coef, scope):
        """The KL coefficient as a magnitude (a penalty is subtracted however the sign is written)."""
        if isinstance(coef, cst.UnaryOperation) and isinstance(coef.operator, cst.Minus):
            coef = coef.expression
        ev = self._kl_coef_value(coef, scope)
        if isinstance(ev, Known) and isinstance(ev.value, (int, float)) and not isinstance(ev.value, bool):
            return Known(abs(ev.value), ev.line)
        return ev

    def _kl_coef_value(self, coef, scope):
        # kl_ctl.value / self.kl_ctl.value with a controller object
        if isinstance(coef, cst.Attribute) and coef.attr.value in ("value", "coef", "kl_coef"):
            ctl = self.controller(coef.value, scope)
            if ctl is not None:
                return ctl
        if isinstance(coef, (cst.Name, cst.Attribute)):
            ctl = self.controller(coef, scope)
            if ctl is not None:
                return ctl
        return self.p.ev(coef, scope)

    def controller(self, node, scope):
        """Initial coefficient of a KL controller object (Adaptive/FixedKLController(...)); sets target/horizon."""
        exprs = []
        if isinstance(node, cst.Name):
            exprs = [(e, scope) for e in self.p.assignments_of(node.value, scope)]
        elif isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self":
            cls = self.p.class_of(scope)
            exprs = self.p.self_assignments(cls, node.attr.value) if cls else []
        if len(exprs) != 1 or not isinstance(exprs[0][0], cst.Call):
            return None
        call, sc = exprs[0]
        name = _last(call.func) or ""
        if "KLController" not in name and "KLCtl" not in name:
            return None
        init = _call_arg(call, 0, "init_kl_coef") or _call_arg(call, 0, "kl_coef") or _call_arg(call, 0, "value")
        if "Adaptive" in name:
            target = _call_arg(call, 1, "target")
            horizon = _call_arg(call, 2, "horizon")
            self.emit("algorithm.kl.target", self.p.ev(target, sc), "the KL target")
            self.emit("algorithm.kl.horizon", self.p.ev(horizon, sc), "the KL horizon")
        return self.p.ev(init, sc)

    def kl_reference(self, expr, scope) -> str:
        """'ref' | 'old' | '' : what the KL expression compares the policy against."""
        subs = self._logprob_pair(expr, scope, depth=0)
        if subs is None:
            return ""
        sides = [self.classify(side, sc) for side, sc in subs]
        if "old" in sides and "ref" not in sides:
            return "old"
        if "ref" in sides:
            return "ref"
        return ""

    def _logprob_pair(self, expr, scope, depth):
        """The two operands (with scopes) of the log-prob difference inside a KL expression."""
        for n in walk(expr):
            if isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Subtract):
                if not isinstance(n.left, (cst.Integer, cst.Float)) and not isinstance(n.right, (cst.Integer, cst.Float)):
                    if not isinstance(n.left, cst.BinaryOperation) and not isinstance(n.right, cst.BinaryOperation):
                        return [(n.left, scope), (n.right, scope)]
        if depth < 3:
            for n in walk(expr):
                if isinstance(n, cst.Call):
                    t = self.p.resolve_callee(n, scope)
                    if t is not None:
                        info, offset = t
                        for r in walk(info.node.body):
                            if isinstance(r, cst.Return) and r.value is not None:
                                inner = self._logprob_pair(r.value, info, depth + 1)
                                if inner is not None:
                                    return [self._bind_back(side, sc, n, info, offset, scope) for side, sc in inner]
                                # return of a local name: follow it
                                if isinstance(r.value, cst.Name):
                                    for e in info.assigns.get(r.value.value, []):
                                        if e is not None:
                                            inner = self._logprob_pair(e, info, depth + 1)
                                            if inner is not None:
                                                return [self._bind_back(side, sc, n, info, offset, scope) for side, sc in inner]
                elif isinstance(n, cst.Name) and n is not expr and scope is not None:
                    pass
            if isinstance(expr, cst.Name):
                for e in self.p.assignments_of(expr.value, scope):
                    if e is not None:
                        return self._logprob_pair(e, scope, depth + 1)
        return None

    def _bind_back(self, side, sc, call, info, offset, caller_scope):
        if isinstance(side, cst.Name) and side.value in info.params and sc is info:
            idx, _ = info.params[side.value]
            pos = 0
            for a in call.args:
                if a.keyword is not None and a.keyword.value == side.value:
                    return (a.value, caller_scope)
                if a.keyword is None and not a.star:
                    if idx is not None and pos + offset == idx:
                        return (a.value, caller_scope)
                    pos += 1
        return (side, sc)

    def classify(self, node, scope, depth=0) -> str:
        """'ref' if a log-prob expression comes from a frozen reference model, 'old' if from the policy."""
        if depth > 4:
            return ""
        # trace data flow first: which model produced it?
        if isinstance(node, cst.Name):
            exprs = [e for e in self.p.assignments_of(node.value, scope) if e is not None]
            if scope is not None and node.value in scope.params and not exprs:
                sites = self.p.calls_by_callee().get(scope.qual, [])
                got = set()
                idx, _ = scope.params[node.value]
                for call, caller, offset in sites:
                    arg = self.p._arg_for(call, idx, node.value, offset)
                    if arg is not None and arg != "star":
                        got.add(self.classify(arg, caller, depth + 1))
                if len(got) == 1:
                    return got.pop()
            for e in exprs:
                role = self.model_role_in(e, scope)
                if role:
                    return role
            for e in exprs:
                r = self.classify(e, scope, depth + 1)
                if r:
                    return r
        if isinstance(node, cst.Call):
            role = self.model_role_in(node, scope)
            if role:
                return role
        text = " ".join(_names_in(node))
        if isinstance(node, cst.Subscript):
            text += " " + _code(node.slice[0]) if node.slice else ""
        for piece in re.split(r"[\s\"'\[\]]+", text):
            if REF_NAME_RE.search(piece):
                return "ref"
        for piece in re.split(r"[\s\"'\[\]]+", text):
            if OLD_NAME_RE.search(piece):
                return "old"
        return ""

    def model_role_in(self, expr, scope) -> str:
        """Role of the model object a log-prob computation in *expr* runs: 'ref' | 'old' | ''."""
        keywords = {id(a.keyword) for a in walk(expr) if isinstance(a, cst.Arg) and a.keyword is not None}
        roles = set()
        for n in walk(expr):
            if isinstance(n, (cst.Name, cst.Attribute)) and id(n) not in keywords:
                role = self.model_role(n, scope)
                if role:
                    roles.add(role)
        return "ref" if "ref" in roles else ("old" if roles else "")

    def model_role(self, node, scope) -> str:
        models = self.models()
        key = _code(node)
        if key in models:
            return models[key]
        return ""

    def models(self) -> dict:
        """Model variables (code -> 'ref' | 'old'): optimised models are the policy ('old'), frozen ones 'ref'."""
        if hasattr(self, "_models"):
            return self._models
        optimised, frozen, built = set(), set(), set()
        for call, scope in self.calls:
            last = _last(call.func) or ""
            qs = self.qn(call.func)
            if last in OPTIMIZERS or any(q.startswith("torch.optim.") and q.rsplit(".", 1)[-1] in OPTIMIZERS for q in qs):
                arg = _call_arg(call, 0, "params")
                if arg is not None:
                    for n in walk(arg):
                        if isinstance(n, cst.Call) and _last(n.func) == "parameters" and isinstance(n.func, cst.Attribute):
                            optimised.add(_code(n.func.value))
                        elif isinstance(n, cst.Name) and n.value not in ("params",):
                            pass
            if last == "load_checkpoint" and len(call.args) >= 2:
                second = call.args[1].value
                target = _code(call.args[0].value)
                if isinstance(second, cst.Name) and second.value == "None":
                    frozen.add(target)
                else:
                    optimised.add(target)
            if last in ("deepcopy", "create_reference_model"):
                parent = self.p.parents.get(call)
                if isinstance(parent, cst.Assign):
                    frozen.add(_code(parent.targets[0].target))
            if last in ("requires_grad_",) and call.args and _code(call.args[0].value) == "False":
                if isinstance(call.func, cst.Attribute):
                    frozen.add(_code(call.func.value))
            if last in ("setup_model_and_optimizer", "get_megatron_optimizer"):
                parent = self.p.parents.get(call)
                if last == "setup_model_and_optimizer" and isinstance(parent, cst.Assign):
                    t = parent.targets[0].target
                    if isinstance(t, cst.Tuple) and t.elements:
                        optimised.add(_code(t.elements[0].value))
                elif last == "get_megatron_optimizer":
                    arg = _call_arg(call, 1, "model_chunks")
                    if arg is not None:
                        optimised.add(_code(arg))
            if last == "backward" and isinstance(call.func, cst.Attribute) and call.args:
                optimised.add(_code(call.func.value))  # deepspeed engine.backward(loss)
        out = {}
        for m in frozen:
            out[m] = "ref"
        for m in optimised:
            if m not in out:
                out[m] = "old"
        self._models = out
        return out

    def kl_estimator(self, expr, scope, depth=0) -> str:
        code = _code(expr)
        if isinstance(expr, cst.Call) and depth < 2:
            t = self.p.resolve_callee(expr, scope)
            if t is not None:
                info = t[0]
                for r in walk(info.node.body):
                    if isinstance(r, cst.Return) and r.value is not None:
                        est = self.kl_estimator(r.value, info, depth + 1)
                        if est:
                            return est
                return ""
            return ""
        if isinstance(expr, cst.Name) and depth < 3:
            for e in self.p.assignments_of(expr.value, scope):
                if e is not None:
                    est = self.kl_estimator(e, scope, depth + 1)
                    if est:
                        return est
            return ""
        if "exp(" in code and re.search(r"-\s*1(\.0*)?\b", code):
            return "k3"
        if "**2" in code.replace(" ", "") or "square(" in code or ".pow(2)" in code:
            return "k2"
        if "exp(" in code or "log(" in code:
            return ""
        for n in walk(expr):
            if isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Subtract):
                return "k1"
        return ""

    # ------------------------------------------------------------------ advantages
    def extract_advantages(self) -> None:
        a = self.a
        gae = self.find_gae()
        group = self.find_group_norm()
        value_loss = self.has_value_loss()
        if group is not None and not value_loss:
            self.emit("algorithm.name", Known("grpo", group[1]))
            self.emit("algorithm.group_size", group[0], "the group size")
        elif gae is not None or value_loss:
            self.emit("algorithm.name", Known("ppo", gae[2] if gae else value_loss))
            if gae is not None:
                self.emit("algorithm.gamma", gae[0], "the discount gamma")
                if gae[1] is not None:
                    self.emit("algorithm.lam", gae[1], "the GAE lambda")
                else:
                    self.emit("algorithm.lam", Known(1.0, gae[2]))
            if group is not None:
                a.refuse("the loop both group-normalises rewards and trains a critic; cannot map it to one "
                         "advantage estimator with certainty")
        else:
            a.refuse("cannot tell how advantages are computed (no GAE recursion with a critic and no "
                     "group-normalised rewards were found)")
        # whitening of advantages over the batch (PPO)
        if self.a.config.get("algorithm.name") == "ppo":
            w = self.find_whitening()
            if w is not None:
                self.emit("algorithm.whiten_advantages", Known(True, w))
            else:
                self.emit("algorithm.whiten_advantages", Known(False, self.p.line(self.main_loop)))

    def find_gae(self):
        """(gamma Ev, lam Ev | None, line) from ``last = delta + g * l * last`` and ``delta = r + g * v' - v``."""
        for info in self.p.funcs.values():
            for node in walk(info.node.body):
                if not isinstance(node, cst.Assign) or not isinstance(node.targets[0].target, (cst.Name, cst.Subscript)):
                    continue
                tgt = node.targets[0].target
                tname = tgt.value if isinstance(tgt, cst.Name) else _code(tgt.value)
                value = node.value
                if not isinstance(value, cst.BinaryOperation) or not isinstance(value.operator, cst.Add):
                    continue
                for delta, prod in ((value.left, value.right), (value.right, value.left)):
                    factors = _factors(prod)
                    if len(factors) < 2:
                        continue
                    rec = [f for f in factors if tname in _names_in(f) or _code(f).startswith(tname)]
                    consts = [f for f in factors if f not in rec]
                    if not rec:
                        continue
                    gamma_node = self._gamma_in_delta(delta, info)
                    if len(consts) == 2:
                        if gamma_node is not None:
                            g = next((c for c in consts if _code(c) == _code(gamma_node)), consts[0])
                        else:
                            g = consts[0]
                        l = consts[1] if g is consts[0] else consts[0]
                        return (self.p.ev(g, info), self.p.ev(l, info), self.p.line(node))
                    if len(consts) == 1 and gamma_node is not None and _code(consts[0]) != _code(gamma_node):
                        # last = delta + gl * last with gl = gamma * lam precomputed: not provable as two keys
                        continue
                    if len(consts) == 1 and (gamma_node is not None or "return" in tname.lower() or "ret" == tname.lower()):
                        return (self.p.ev(consts[0], info), None, self.p.line(node))
        return None

    def _gamma_in_delta(self, delta, info):
        names = []
        if isinstance(delta, cst.Name):
            names = [e for e in info.assigns.get(delta.value, []) if e is not None]
        elif isinstance(delta, cst.Subscript) and isinstance(delta.value, cst.Name):
            names = [e for e in info.assigns.get(delta.value.value, []) if e is not None]
            for n in walk(info.node.body):
                if isinstance(n, cst.Assign) and isinstance(n.targets[0].target, cst.Subscript) and _code(n.targets[0].target.value) == delta.value.value:
                    names.append(n.value)
        for e in names:
            for n in walk(e):
                if isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Multiply):
                    for c, other in ((n.left, n.right), (n.right, n.left)):
                        if isinstance(c, (cst.Name, cst.Attribute, cst.Float, cst.Integer)) and re.search(
                                r"value|next|v_|values", _code(other), re.I):
                            return c
        return None

    def find_group_norm(self):
        """(group size Ev, line) for rewards reshaped to ``(-1, G)`` and normalised within each group."""
        for call, scope in self.calls:
            last = _last(call.func)
            if last not in ("view", "reshape", "unflatten") or not isinstance(call.func, cst.Attribute):
                continue
            args = [x.value for x in call.args if x.keyword is None]
            if last == "unflatten" and len(args) == 2 and isinstance(args[1], cst.Tuple):
                args = [e.value for e in args[1].elements]
            if len(args) != 2:
                continue
            recv = _code(call.func.value)
            if not re.search(r"reward|score|return|adv", recv, re.I):
                continue
            if not (isinstance(args[0], cst.UnaryOperation) and _code(args[0]) == "-1"):
                continue
            g = args[1]
            # normalised within the group: a mean over dim 1 / -1 of the reshaped tensor nearby
            body_code = _code(scope.node) if scope is not None else ""
            if re.search(r"\.mean\(\s*(dim\s*=\s*)?(1|-1)", body_code) or "mean(dim=1" in body_code:
                return (self.p.ev(g, scope), self.p.line(call))
        return None

    def has_value_loss(self):
        for info in self.p.funcs.values():
            for node in walk(info.node.body):
                if isinstance(node, cst.Assign) and isinstance(node.targets[0].target, cst.Name):
                    if VALUE_LOSS_RE.search(node.targets[0].target.value):
                        return self.p.line(node)
        return None

    def find_whitening(self):
        for info in self.p.funcs.values():
            for node in walk(info.node.body):
                if isinstance(node, cst.Assign) and isinstance(node.targets[0].target, cst.Name):
                    t = node.targets[0].target.value
                    code = _code(node.value).replace(" ", "")
                    if re.search(r"adv", t, re.I) and re.search(r"\.mean\(\)", code) and re.search(r"\.std\(\)", code):
                        return self.p.line(node)
                if isinstance(node, cst.Call) and (_last(node.func) or "") in ("whiten", "masked_whiten"):
                    return self.p.line(node)
        return None

    # ------------------------------------------------------------------ loss coefficients
    def extract_loss_coefs(self) -> None:
        for info in self.p.funcs.values():
            for node in walk(info.node.body):
                if not isinstance(node, (cst.Assign, cst.AugAssign, cst.Return)):
                    continue
                if isinstance(node, cst.Return):
                    if node.value is None or not LOSS_RE.search(info.name):
                        continue
                    tgt_code = info.name
                else:
                    tgt = node.targets[0].target if isinstance(node, cst.Assign) else node.target
                    tgt_code = _code(tgt)
                if not LOSS_RE.search(tgt_code) or VALUE_LOSS_RE.search(tgt_code):
                    continue
                for n in walk(node.value):
                    if isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Multiply):
                        for c, other in ((n.left, n.right), (n.right, n.left)):
                            oc = _code(other)
                            if isinstance(c, (cst.BinaryOperation, cst.Call)):
                                continue
                            if VALUE_LOSS_RE.search(oc):
                                self.emit("algorithm.vf_coef", self.p.ev(c, info), "the value-loss coefficient")
                            elif ENTROPY_RE.search(oc) and not ENTROPY_RE.search(_code(c)):
                                self.emit("algorithm.entropy_coef", self.p.ev(c, info), "the entropy coefficient")
                            elif re.search(r"ptx|pretrain|lm_loss|sft_loss", oc, re.I):
                                self.a.warn(f"pretraining (ptx) loss mixing at {self.loc(self.p.line(n))} is not "
                                            "supported by MegatronTrainer; it is dropped")

    # ------------------------------------------------------------------ loop shape
    def extract_loop_shape(self) -> None:
        a = self.a
        loop = self.main_loop
        scope = self.loop_func
        inner_data_loop = False
        for n in walk(loop.body):
            if isinstance(n, (cst.For, cst.While)) and n is not loop:
                tags = self.reach(n)
                if "gen" in tags and ("backward" in tags or "trl_step" in tags):
                    inner_data_loop = True
        steps = self.loop_count(loop, scope)
        if inner_data_loop:
            a.warn("trainer.total_steps is left out: the number of steps depends on the size of the dataset "
                   f"(nested loops at {self.loc(self.p.line(loop))})")
        elif steps is not None:
            self.emit("trainer.total_steps", steps, "the number of training steps")
        else:
            a.warn(f"trainer.total_steps is left out: the loop at {self.loc(self.p.line(loop))} runs over data "
                   "whose length is known only at run time")
        # path from the main loop to the backward call: epochs and minibatch loops
        path = self.path_to_backward(loop.body, scope, set())
        if path is None:
            return
        epochs_set = False
        for kind, node, sc in path:
            if kind == "range1" and not epochs_set:
                self.emit("algorithm.ppo_epochs", self.p.ev(node, sc), "the number of PPO epochs")
                epochs_set = True
            elif kind == "range3":
                self.emit("algorithm.mini_batch_size", self.p.ev(node, sc), "the minibatch size")
            elif kind == "split":
                self.emit("algorithm.mini_batch_size", self.p.ev(node, sc), "the minibatch size")
        if not epochs_set:
            self.emit("algorithm.ppo_epochs", Known(1, self.p.line(loop)))

    def loop_count(self, loop, scope):
        if isinstance(loop, cst.For):
            it = loop.iter
            if isinstance(it, cst.Call) and _last(it.func) == "range":
                args = [x.value for x in it.args]
                if len(args) == 1:
                    return self.p.ev(args[0], scope)
                if len(args) == 2:
                    lo, hi = self.p.ev(args[0], scope), self.p.ev(args[1], scope)
                    if isinstance(lo, Known) and isinstance(hi, Known):
                        return Known(hi.value - lo.value, hi.line)
                    return hi if isinstance(hi, Runtime) else None
            if isinstance(it, cst.Call) and _last(it.func) in ("tqdm", "trange"):
                if _last(it.func) == "trange" and it.args:
                    return self.p.ev(it.args[0].value, scope)
                inner = it.args[0].value if it.args else None
                if isinstance(inner, cst.Call) and _last(inner.func) == "range":
                    fake = cst.For(target=loop.target, iter=inner, body=loop.body)
                    return self.loop_count(fake, scope) if len(inner.args) <= 2 else None
            return None
        if isinstance(loop, cst.While):
            t = loop.test
            if isinstance(t, cst.Comparison) and len(t.comparisons) == 1:
                op = t.comparisons[0].operator
                if isinstance(op, cst.LessThan):
                    return self.p.ev(t.comparisons[0].comparator, scope)
                if isinstance(op, cst.LessThanEqual):
                    v = self.p.ev(t.comparisons[0].comparator, scope)
                    return Known(v.value + 1, v.line) if isinstance(v, Known) and isinstance(v.value, int) else v
        return None

    def path_to_backward(self, body, scope, seen):
        """Loops (kind, count node, scope) from *body* down to the ``.backward()`` call."""
        for n in walk(body):
            if isinstance(n, cst.Call) and "backward" in self.call_tags(n):
                return self._loops_between(body, n, scope)
        for n in walk(body):
            if isinstance(n, cst.Call):
                t = self.p.resolve_callee(n, scope)
                if t is None or id(t[0].node) in seen:
                    continue
                if "backward" in self.reach(t[0].node):
                    seen.add(id(t[0].node))
                    outer = self._loops_between(body, n, scope)
                    inner = self.path_to_backward(t[0].node.body, t[0], seen)
                    if inner is not None:
                        return outer + inner
        return None

    def _loops_between(self, body, node, scope):
        out = []
        for anc in self.p.ancestors(node):
            if anc is body:
                break
            if isinstance(anc, cst.For):
                it = anc.iter
                if isinstance(it, cst.Call) and _last(it.func) == "enumerate" and it.args:
                    it = it.args[0].value
                if isinstance(it, cst.Call) and _last(it.func) == "range":
                    args = [x.value for x in it.args]
                    if len(args) == 1:
                        out.append(("range1", args[0], scope))
                    elif len(args) == 3:
                        out.append(("range3", args[2], scope))
                elif isinstance(it, cst.Call) and _last(it.func) in ("split", "chunk") and it.args:
                    if _last(it.func) == "split":
                        out.append(("split", it.args[0].value, scope))
                elif isinstance(it, cst.Call) and _last(it.func) in ("DataLoader",):
                    bs = _kwarg(it, "batch_size")
                    if bs is not None:
                        out.append(("split", bs, scope))
        out.reverse()
        return out

    # ------------------------------------------------------------------ TRL
    def extract_trl(self) -> None:
        a = self.a
        cfg = None
        for call, scope in self.calls:
            qs = self.qn(call.func)
            if any(q.startswith("trl") and q.endswith("PPOTrainer") for q in qs):
                arg = _kwarg(call, "config")
                if arg is None and call.args and call.args[0].keyword is None:
                    arg = call.args[0].value
                if arg is not None:
                    cfg = self.p.ev_record(arg, scope)
                    if cfg is None:
                        a.refuse(f"the PPOConfig passed at {self.loc(self.p.line(call))} is not static")
                        return
        if cfg is None:
            a.refuse("cannot find the PPOConfig of the TRL PPOTrainer")
            return
        f = lambda k: self.p.record_field(cfg, k, cfg.line) if k in cfg.fields else None  # noqa: E731
        self.emit("algorithm.name", Known("ppo", cfg.line))
        mapping = {
            "cliprange": "algorithm.clip_ratio", "cliprange_value": "algorithm.value_clip",
            "vf_coef": "algorithm.vf_coef", "ppo_epochs": "algorithm.ppo_epochs",
            "mini_batch_size": "algorithm.mini_batch_size", "batch_size": "data.rollout_batch_size",
            "gamma": "algorithm.gamma", "lam": "algorithm.lam", "learning_rate": "optim.actor.lr",
            "max_grad_norm": "optim.actor.clip_grad",
        }
        for k, key in mapping.items():
            if k in cfg.fields:
                self.emit(key, f(k), k)
        if "init_kl_coef" in cfg.fields:
            self.emit("algorithm.kl.coef", f("init_kl_coef"), "init_kl_coef")
            self.emit("algorithm.kl.placement", Known("reward", cfg.line))
            kp = f("kl_penalty")
            est = {"kl": "k1", "mse": "k2"}.get(kp.value if isinstance(kp, Known) else "kl")
            if est:
                self.emit("algorithm.kl.estimator", Known(est, kp.line if isinstance(kp, Known) else cfg.line))
            else:
                a.warn(f"algorithm.kl.estimator is left out: TRL kl_penalty={kp.value!r} has no equivalent")
        adap = f("adap_kl_ctrl")
        if not (isinstance(adap, Known) and adap.value is False):
            if "target" in cfg.fields:
                self.emit("algorithm.kl.target", f("target"), "target")
            if "horizon" in cfg.fields:
                self.emit("algorithm.kl.horizon", f("horizon"), "horizon")
        if "model_name" in cfg.fields:
            v = f("model_name")
            if isinstance(v, Known) and isinstance(v.value, str):
                self.a.config.setdefault("_model_name", (v.value, v.line))
        for k in ("ppo_epochs",):
            pass
        for call, scope in self.calls:
            last = _last(call.func)
            if last == "generate" or (last or "").endswith("generate"):
                self.rollout_kwargs(call, scope)
        loop = self.main_loop
        inner = any(isinstance(n, (cst.For, cst.While)) and "trl_step" in self.reach(n)
                    for n in walk(loop.body) if n is not loop)
        if inner or not (isinstance(loop, cst.For) and isinstance(loop.iter, cst.Call) and _last(loop.iter.func) == "range"):
            a.warn("trainer.total_steps is left out: the number of steps depends on the size of the dataset "
                   f"({self.loc(self.p.line(loop))})")
        else:
            self.emit("trainer.total_steps", self.loop_count(loop, self.loop_func), "the number of training steps")

    # ------------------------------------------------------------------ common pieces
    def extract_common(self, trl: bool) -> None:
        self.extract_optimizers(trl)
        if not trl:
            self.extract_rollout()
        self.extract_parallel()
        self.extract_save()
        self.extract_hooks(trl)
        self.extract_reward()
        self.unsupported()

    def rollout_kwargs(self, call, scope, info: Optional[FuncInfo] = None) -> None:
        names = {"temperature": "rollout.temperature", "top_p": "rollout.top_p",
                 "max_new_tokens": "data.max_response_length", "max_response_length": "data.max_response_length",
                 "response_length": "data.max_response_length", "max_gen_len": "data.max_response_length"}
        for kw, key in names.items():
            v = _kwarg(call, kw)
            if v is not None:
                self.emit(key, self.p.ev(v, scope), kw)
            elif info is not None and kw in info.params:
                self.emit(key, self.p.ev_param(info, kw), kw)
        if _kwarg(call, "top_k") is not None or (info is not None and "top_k" in info.params):
            v = self.p.ev(_kwarg(call, "top_k"), scope) if _kwarg(call, "top_k") is not None else self.p.ev_param(info, "top_k")
            if isinstance(v, Known) and v.value not in (0, None):
                self.a.warn(f"top_k={v.value} sampling ({self.loc(v.line)}) is not a contract key; set rollout.top_k by hand")
        if _kwarg(call, "max_length") is not None:
            self.a.warn(f"max_length at {self.loc(self.p.line(call))} counts prompt and response together; "
                        "data.max_response_length is left out")

    def extract_rollout(self) -> None:
        for call, scope in self.calls:
            if "gen" not in self.call_tags(call):
                continue
            if call not in [n for n in walk(self.main_loop)] and scope is self.loop_func:
                continue
            t = self.p.resolve_callee(call, scope)
            self.rollout_kwargs(call, scope, t[0] if t else None)
        # prompts per step: an explicit batch-size argument of the prompt sampler in the main loop
        for n in walk(self.main_loop.body):
            if isinstance(n, cst.Call):
                for kw in ("rollout_batch_size", "num_prompts", "n_prompts", "prompts_per_step"):
                    v = _kwarg(n, kw)
                    if v is not None:
                        self.emit("data.rollout_batch_size", self.p.ev(v, self.loop_func), kw)
                t = self.p.resolve_callee(n, self.loop_func)
                if t is not None:
                    for kw in ("rollout_batch_size", "num_prompts", "n_prompts", "prompts_per_step"):
                        if kw in t[0].params and _kwarg(n, kw) is None:
                            self.emit("data.rollout_batch_size", self.p.ev_param(t[0], kw), kw)

    def extract_optimizers(self, trl: bool) -> None:
        a = self.a
        found_actor = False
        for call, scope in self.calls:
            last = _last(call.func) or ""
            qs = self.qn(call.func)
            is_opt = last in OPTIMIZERS and (any(q.startswith(("torch.optim", "apex", "deepspeed", "bitsandbytes", "transformers", "lion"))
                                                 for q in qs) or last in ("AdamW", "Adam", "FusedAdam"))
            if is_opt:
                params = _call_arg(call, 0, "params")
                role = "critic" if params is not None and re.search(r"critic|value|vf", _code(params), re.I) else "actor"
                lr = _call_arg(call, 1, "lr") if last in ("Adam", "AdamW", "SGD", "RMSprop", "Adagrad") else _kwarg(call, "lr")
                self.emit(f"optim.{role}.lr", self.p.ev(lr, scope) if lr is not None else None,
                          f"the {role} learning rate" if lr is not None else "")
                wd = _kwarg(call, "weight_decay")
                if wd is not None and role == "actor":
                    self.emit("optim.actor.weight_decay", self.p.ev(wd, scope), "the weight decay")
                if role == "actor":
                    found_actor = True
                    self.check_lr_constants(lr, scope)
            elif last == "OptimizerConfig":
                for kw, key in (("lr", "optim.actor.lr"), ("weight_decay", "optim.actor.weight_decay"),
                                ("clip_grad", "optim.actor.clip_grad")):
                    v = _kwarg(call, kw)
                    if v is not None:
                        self.emit(key, self.p.ev(v, scope), kw)
                found_actor = True
                self.check_lr_constants(_kwarg(call, "lr"), scope)
            elif last == "setup_model_and_optimizer":
                rec = self.p.args_record()
                for k, key in (("lr", "optim.actor.lr"), ("weight_decay", "optim.actor.weight_decay"),
                               ("clip_grad", "optim.actor.clip_grad")):
                    ev = self.p.record_field(rec, k, self.p.line(call))
                    if isinstance(ev, Runtime):
                        ev = Runtime(f"setup_model_and_optimizer() reads args.{k}, which is not set in this file "
                                     "(a Megatron-LM command-line flag)", self.p.line(call))
                    self.emit(key, ev, f"args.{k}")
                found_actor = True
            elif last in ("clip_grad_norm_", "clip_grad_norm"):
                params = _call_arg(call, 0, "parameters")
                v = _call_arg(call, 1, "max_norm")
                if params is not None and re.search(r"critic|value|vf", _code(params), re.I):
                    continue
                if v is not None:
                    self.emit("optim.actor.clip_grad", self.p.ev(v, scope), "the gradient clipping norm")
            elif SCHEDULER_RE.search(last) or any(SCHEDULER_RE.search(q) for q in qs):
                a.warn(f"custom learning-rate schedule {last}() at {self.loc(self.p.line(call))} is not supported; "
                       "MegatronTrainer uses a constant LR (with optim.actor.warmup_steps)")
        for node in walk(self.p.module):
            if isinstance(node, cst.Assign):
                tgt = _code(node.targets[0].target).replace(" ", "")
                if "param_groups" in tgt and ('["lr"]' in tgt or "['lr']" in tgt):
                    a.warn(f"custom learning-rate anneal at {self.loc(self.p.line(node))} (param_groups lr assignment) "
                           "is not supported; MegatronTrainer uses a constant LR")
        if not found_actor and not trl:
            a.warn("no optimizer construction was found; optim.actor.lr is left out")

    def check_lr_constants(self, lr_node, scope) -> None:
        """Warn when an LR-like constant exists but a different value reaches the optimizer."""
        if lr_node is None:
            return
        used = self.p.ev(lr_node, scope)
        if not isinstance(used, Known):
            return
        for name, exprs in list(self.p.module_assigns.items()):
            if not re.fullmatch(r"(actor_|policy_)?(lr|learning_rate)", name, re.I):
                continue
            if len(exprs) != 1 or exprs[0] is None:
                continue
            v = self.p.ev(exprs[0], None)
            if isinstance(v, Known) and isinstance(v.value, (int, float)) and v.value != used.value:
                self.a.warn(f"{name} = {v.value!r} is defined at {self.loc(v.line)} but the optimizer receives "
                            f"{used.value!r} ({self.loc(used.line)}); optim.actor.lr uses the value that reaches the optimizer")
        rec = self.p.args_record()
        for k in ("lr", "learning_rate", "actor_lr"):
            if k in rec.fields:
                v = self.p.record_field(rec, k, 0)
                if isinstance(v, Known) and isinstance(v.value, (int, float)) and v.value != used.value \
                        and "args" not in _code(lr_node):
                    self.a.warn(f"--{k.replace('_', '-')} defaults to {v.value!r} ({self.loc(v.line)}) but the optimizer "
                                f"receives {used.value!r} ({self.loc(used.line)}); optim.actor.lr uses the value that "
                                "reaches the optimizer")

    def extract_parallel(self) -> None:
        for call, scope in self.calls:
            if _last(call.func) == "initialize_model_parallel":
                tp = _call_arg(call, 0, "tensor_model_parallel_size")
                pp = _call_arg(call, 1, "pipeline_model_parallel_size")
                if tp is not None:
                    self.emit("trainer.args.tp_size", self.p.ev(tp, scope), "the tensor-parallel size")
                if pp is not None:
                    self.emit("trainer.args.pp_size", self.p.ev(pp, scope), "the pipeline-parallel size")
            if self.is_fwd_bwd(call):
                mbs = _kwarg(call, "micro_batch_size")
                if mbs is not None:
                    self.emit("algorithm.micro_batch_size", self.p.ev(mbs, scope), "the micro-batch size")
        rec = self.p.args_record()
        if self.p.args_record is not None and any(_last(c.func) == "initialize_megatron" for c, _ in self.calls):
            for k, key in (("tensor_model_parallel_size", "trainer.args.tp_size"),
                           ("pipeline_model_parallel_size", "trainer.args.pp_size")):
                if k in rec.fields and key not in self.a.config:
                    ev = self.p.record_field(rec, k, 0)
                    if isinstance(ev, Known):
                        self.emit(key, ev)

    def extract_save(self) -> None:
        for call, scope in self.calls:
            if _last(call.func) not in ("save_checkpoint", "save_model", "save_pretrained", "save"):
                continue
            if not any(n is call for n in walk(self.main_loop)) and not self._reached_from_loop(scope):
                continue
            for anc in self.p.ancestors(call):
                if isinstance(anc, cst.If):
                    m = _find_modulo(anc.test)
                    if m is not None:
                        self.emit("trainer.save_every", self.p.ev(m, scope), "the checkpoint interval")
                        return
                if anc is self.main_loop:
                    break

    def _reached_from_loop(self, scope) -> bool:
        if scope is None:
            return False
        return any(f.node is scope.node for f in self.callees_closure(self.main_loop))

    def extract_hooks(self, trl: bool) -> None:
        a = self.a
        mod = self.module_name
        defs = {stmt.name.value for stmt in self.p.module.body if isinstance(stmt, cst.FunctionDef)}
        provider = None
        if "model_provider" in defs:
            provider = "model_provider"
        else:
            for call, scope in self.calls:
                if _last(call.func) in ("get_model", "setup_model_and_optimizer") and call.args:
                    first = call.args[0].value
                    if isinstance(first, cst.Name) and first.value in defs:
                        provider = first.value
        if provider is not None:
            node = next(s for s in self.p.module.body if isinstance(s, cst.FunctionDef) and s.name.value == provider)
            self.emit("model.actor.args.model_provider", Known(f"{mod}:{provider}", self.p.line(node)))
        else:
            name = a.config.pop("_model_name", None)
            path = name or self._from_pretrained_path()
            if path is not None:
                self.emit("model.actor.args.model_name_or_path", Known(path[0], path[1]))
                if not path[0].startswith(("/", ".")):
                    a.warn(f"model.actor.args.model_name_or_path={path[0]!r} looks like a Hub id; MegatronTrainer "
                           "expects a local Hugging Face directory, download it first")
            else:
                a.refuse("no model_provider() function and no model path were found: the model is built inline; "
                         "move its construction into a top-level model_provider(pre_process=True, "
                         "post_process=True) and run migrate again")
        a.config.pop("_model_name", None)
        for hook in ("initialize_megatron", "load_checkpoint"):
            if hook in defs:
                node = next(s for s in self.p.module.body if isinstance(s, cst.FunctionDef) and s.name.value == hook)
                self.emit(f"model.actor.args.{hook}", Known(f"{mod}:{hook}", self.p.line(node)))
            elif hook in self.p.imports:
                a.warn(f"{hook} is imported from {self.p.imports[hook]}, not defined in this file; MegatronTrainer "
                       f"uses its own unless you set model.actor.args.{hook}")

    def _from_pretrained_path(self):
        for call, scope in self.calls:
            if _last(call.func) == "from_pretrained" and call.args:
                recv = _code(call.func.value) if isinstance(call.func, cst.Attribute) else ""
                if "Tokenizer" in recv:
                    continue
                v = self.p.ev(call.args[0].value, scope)
                if isinstance(v, Known) and isinstance(v.value, str):
                    return (v.value, v.line)
        return None

    def extract_reward(self) -> None:
        a = self.a
        defs = {stmt.name.value: stmt for stmt in self.p.module.body if isinstance(stmt, cst.FunctionDef)}
        region = [self.main_loop] + [f.node for f in self.callees_closure(self.main_loop)]
        top_level, inner = [], []
        for r in region:
            for n in walk(r):
                if not isinstance(n, cst.Call):
                    continue
                scope = self.p.func_of(n)
                name = _last(n.func) or ""
                target = self.p.resolve_callee(n, scope)
                if target is not None and target[0].cls is None and target[0].parent is None and REWARD_RE.search(name):
                    top_level.append((target[0], n))
                elif target is not None and target[0].parent is not None and REWARD_RE.search(name):
                    inner.append((name, n))
                elif isinstance(n.func, cst.Name) and REWARD_RE.search(name) and target is None:
                    if name in defs:
                        continue
                    exprs = self.p.assignments_of(name, scope)
                    if exprs:
                        inner.append((name, n))
        # a top-level function referenced as a value inside the loop (rewards = list(map(reward_fn, ...)))
        if not top_level:
            for r in region:
                for n in walk(r):
                    if isinstance(n, cst.Name) and n.value in defs and REWARD_RE.search(n.value):
                        parent = self.p.parents.get(n)
                        if isinstance(parent, cst.Arg):
                            top_level.append((self.p.funcs[id(defs[n.value])], n))
        fns = {f.qual: (f, n) for f, n in top_level}
        if len(fns) > 1:
            # reward helpers calling each other: keep the outermost one
            called = set()
            for f, _ in fns.values():
                for c in self.callees_closure(f.node.body):
                    called.add(c.qual)
            fns = {q: v for q, v in fns.items() if q not in called}
        if len(fns) == 1 and not inner:
            f, n = next(iter(fns.values()))
            self.emit("model.reward.type", Known("function", self.p.line(f.node)))
            self.emit("model.reward.args.path", Known(f"{self.module_name}:{f.name}", self.p.line(f.node)))
            nparams = len([p for p in f.params.values() if p[1].star not in ("*", "**") and p[1].default is None])
            if nparams != 2:
                a.warn(f"the reward function {f.name}() ({self.loc(self.p.line(f.node))}) takes {nparams} required "
                       "argument(s); MegatronTrainer calls reward_fn(response_text, ground_truth) -> float")
            return
        if len(fns) > 1:
            a.warn("several reward functions are called in the loop (" + ", ".join(sorted(fns)) +
                   "); model.reward.args.path is left out")
        where = inner[0][1] if inner else self.main_loop
        what = inner[0][0] if inner else "the reward"
        a.reward_todo = (f"TODO(verl-bridge): {what} was built inside the training code "
                         f"({self.loc(self.p.line(where))}); move it to a top-level "
                         "reward_fn(response_text, ground_truth) -> float and set model.reward.args.path")
        a.warn(f"the reward ({what}, {self.loc(self.p.line(where))}) is built inside the training code, not a plain "
               "top-level function; model.reward.args.path is left out and a TODO was added")

    def unsupported(self) -> None:
        a = self.a
        code = self.p.module
        for node in walk(code):
            if isinstance(node, cst.Call):
                last = _last(node.func) or ""
                qs = self.qn(node.func)
                if re.search(r"(^|_)ema($|_)|Exponential|Averaged|moving_average", last, re.I) \
                        or any("swa_utils" in q for q in qs):
                    a.warn(f"EMA of the weights ({last}() at {self.loc(self.p.line(node))}) is not supported by MegatronTrainer")
            elif isinstance(node, cst.Assign) and isinstance(node.targets[0].target, cst.Attribute) and re.search(
                    r"ptx", node.targets[0].target.attr.value, re.I):
                a.warn(f"pretraining (ptx) loss mixing ({_code(node.targets[0].target)} at "
                       f"{self.loc(self.p.line(node))}) is not supported by MegatronTrainer; it is dropped")
            elif isinstance(node, (cst.Assign,)) and isinstance(node.targets[0].target, cst.Name):
                if re.search(r"(^|_)ema($|_)", node.targets[0].target.value, re.I):
                    a.warn(f"EMA of the weights ({node.targets[0].target.value} at {self.loc(self.p.line(node))}) "
                           "is not supported by MegatronTrainer")
                if re.search(r"ptx", node.targets[0].target.value, re.I):
                    a.warn(f"pretraining (ptx) loss mixing ({node.targets[0].target.value} at "
                           f"{self.loc(self.p.line(node))}) is not supported by MegatronTrainer; it is dropped")


_MISSING = object()


def _factors(node) -> list:
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
        return _factors(node.left) + _factors(node.right)
    return [node]


def _find_modulo(test):
    for n in walk(test):
        if isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Modulo):
            return n.right
    return None


def analyze(prog: Program, module_name: str) -> Analysis:
    return Recognizer(prog, module_name).run()
