"""Log-prob roles: which model (frozen reference or the policy) produced a log-prob tensor."""

from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from .._static import FuncInfo, Known, Record, Runtime, dotted, walk
from .base import (ENTROPY_RE, GEN_RE, LOSS_RE, OLD_NAME_RE, OPTIMIZERS, REF_NAME_RE, REWARD_RE, SCHEDULER_RE,
                   VALUE_LOSS_RE, _MISSING, _call_arg, _code, _factors, _find_modulo, _is_one, _kwarg, _last,
                   _names_in)


class LogProbRolesMixin:
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
                        inner = self._logprob_pair(e, scope, depth + 1)
                        if inner is not None:
                            return inner
            else:
                # a named log-ratio inside the KL expression: ``r = ref_lp - lp; kl = exp(r) - 1 - r``
                for n in walk(expr):
                    if isinstance(n, cst.Name):
                        for e in self.p.assignments_of(n.value, scope):
                            if isinstance(e, cst.BinaryOperation) and isinstance(e.operator, cst.Subtract) and \
                                    all(isinstance(x, (cst.Name, cst.Attribute, cst.Subscript)) for x in (e.left, e.right)):
                                return [(e.left, scope), (e.right, scope)]
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
                    owner = self._parameters_owner(call.func.value, scope)
                    if owner is not None:
                        frozen.add(owner)
            if last in ("setup_model_and_optimizer", "get_megatron_optimizer"):
                parent = self.p.parents.get(call)
                if last == "setup_model_and_optimizer" and isinstance(parent, cst.Assign):
                    t = parent.targets[0].target
                    if isinstance(t, cst.Tuple) and t.elements:
                        opt = t.elements[1].value if len(t.elements) > 1 else None
                        if isinstance(opt, cst.Name) and opt.value == "_":
                            frozen.add(_code(t.elements[0].value))  # its optimizer is thrown away
                        else:
                            optimised.add(_code(t.elements[0].value))
                elif last == "get_megatron_optimizer":
                    arg = _call_arg(call, 1, "model_chunks")
                    if arg is not None:
                        optimised.add(_code(arg))
            if last == "parameters" and isinstance(call.func, cst.Attribute):
                # for p in ref.parameters(): p.requires_grad = False
                loop = self.p.parents.get(call)
                if isinstance(loop, cst.For) and loop.iter is call and isinstance(loop.target, cst.Name):
                    var = loop.target.value
                    for n in walk(loop.body):
                        if isinstance(n, cst.Assign) and len(n.targets) == 1 and \
                                _code(n.targets[0].target) == f"{var}.requires_grad" and _code(n.value) == "False":
                            frozen.add(_code(call.func.value))
            if last == "backward" and isinstance(call.func, cst.Attribute) and call.args:
                optimised.add(_code(call.func.value))  # deepspeed engine.backward(loss)
            if "deepspeed.initialize" in qs:
                # an engine built with no optimizer (no optimizer= / model_parameters= and no "optimizer"
                # in its config) never updates its weights: a frozen model (the reference)
                parent = self.p.parents.get(call)
                target = None
                if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
                    t = parent.targets[0].target
                    target = t.elements[0].value if isinstance(t, (cst.Tuple, cst.List)) and t.elements else t
                cfg = _kwarg(call, "config") or _kwarg(call, "config_params")
                rec = self.p.ev_record(cfg, scope) if cfg is not None else None
                if target is not None and rec is not None and rec.kind == "dict":
                    trained = any(isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and
                                  n.func.attr.value in ("backward", "step") and _code(n.func.value) == _code(target)
                                  for n in walk(scope.node if scope is not None else self.p.module))
                    if _kwarg(call, "optimizer") is None and _kwarg(call, "model_parameters") is None and \
                            "optimizer" not in rec.fields and not trained:
                        frozen.add(_code(target))
                    else:
                        optimised.add(_code(target))
        out = {}
        for m in frozen:
            out[m] = "ref"
        for m in optimised:
            if m not in out:
                out[m] = "old"
        self._models = out
        return out

    def _parameters_owner(self, var, scope):
        """``for p in ref_model.parameters(): p.requires_grad_(False)`` freezes ``ref_model``."""
        if not isinstance(var, cst.Name):
            return None
        for anc in self.p.ancestors(var):
            if isinstance(anc, cst.For) and isinstance(anc.target, cst.Name) and anc.target.value == var.value:
                it = anc.iter
                if isinstance(it, cst.Call) and _last(it.func) == "parameters" and isinstance(it.func, cst.Attribute):
                    base = it.func.value
                    while isinstance(base, cst.Subscript):
                        base = base.value
                    return _code(base)
            if isinstance(anc, cst.FunctionDef):
                break
        return None
