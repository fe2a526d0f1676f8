"""The KL penalty: where it sits (reward or loss), its coefficient, controller and estimator."""

from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from .._static import FuncInfo, Known, Record, Runtime, dotted, walk
from .base import (ENTROPY_RE, GEN_RE, LOSS_RE, OLD_NAME_RE, OPTIMIZERS, REF_NAME_RE, REWARD_RE, SCHEDULER_RE,
                   VALUE_LOSS_RE, _MISSING, _call_arg, _code, _factors, _find_modulo, _is_one, _kwarg, _last,
                   _names_in)


class KLMixin:
    # ------------------------------------------------------------------ KL
    def kl_sites(self):
        """(target name, value expr, scope, assignment node) for assignments that compute a KL term."""
        out = []
        for info in list(self.p.funcs.values()) + [None]:
            assigns = info.assigns if info is not None else self.p.module_assigns
            for name, exprs in assigns.items():
                if "kl" not in name.lower() and not any(e is not None and _k3_shape(e) for e in exprs):
                    continue
                for e in exprs:
                    if e is not None and not isinstance(e, (cst.Integer, cst.Float)):
                        out.append((name, e, info))
        return out


    def _refuse_unless_reference(self, a, expr, scope) -> bool:
        """Refuse (and return True) unless the KL term ``expr`` is measured against a frozen reference."""
        ref_side = self.kl_reference(expr, scope)
        if ref_side == "old":
            a.refuse(f"{self.loc(self.p.line(expr))}: the KL term is measured against the old policy "
                     "(the same model before the update), not against a frozen reference model; "
                     "MegatronTrainer's KL penalty means something different: compute it against a frozen "
                     "copy of the initial model (ref.requires_grad_(False)) or remove it")
        elif ref_side != "ref":
            a.refuse(f"{self.loc(self.p.line(expr))}: cannot tell what the KL term is measured against "
                     "(a frozen reference model or the old policy); compute the reference log-probs from a "
                     "model frozen with requires_grad_(False) in this file")
        return ref_side != "ref"
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
            if self._refuse_unless_reference(a, expr, scope):
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
            frozen = sorted(m for m, role in self.models().items() if role == "ref" and self._used_in_loop(m))
            if frozen:
                # a reference model exists, so the loop most likely penalises KL against it: 0.0 could be wrong
                a.refuse(f"{self.loc(self.p.line(self.main_loop))}: a frozen reference model ({', '.join(frozen)}) "
                         "is built but no KL term against it could be mapped; write the penalty as "
                         "`coef * (logp - ref_logp)` added to the loss or subtracted from the rewards (or remove "
                         "the reference model if the loop has no KL penalty)")
            elif self._untrained_lms_in_loop():
                # a second language model the loop runs but never trains is most likely a reference whose
                # KL term was not recognised: 0.0 could be wrong, so the key stays out
                a.warn("algorithm.kl.coef is left out: no KL term was recognised, but the loop runs a language "
                       f"model that it never trains ({', '.join(self._untrained_lms_in_loop())}); set "
                       "algorithm.kl.coef yourself (0.0 if it is not a reference for a KL penalty)")
            else:
                self.emit("algorithm.kl.coef", Known(0.0, self.p.line(self.main_loop)))
                a.warn("no KL penalty against a reference model was found (no frozen reference model either); "
                       "algorithm.kl.coef is set to 0.0")

    def _untrained_lms_in_loop(self) -> list:
        """Names of causal LMs loaded (``*ForCausalLM*.from_pretrained`` / ``deepcopy``) that no optimizer
        trains and that the training loop uses."""
        trained = {m for m, role in self.models().items() if role == "old"}
        out = []
        for call, scope in self.calls:
            code = _code(call.func)
            if not (("CausalLM" in code and code.endswith("from_pretrained")) or _last(call.func) == "deepcopy"):
                continue
            parent = self.p.parents.get(call)
            if not (isinstance(parent, cst.Assign) and len(parent.targets) == 1 and
                    isinstance(parent.targets[0].target, cst.Name)):
                continue
            name = parent.targets[0].target.value
            if name not in trained and name not in out and self._used_in_loop(name):
                if any(isinstance(n, cst.Call) and _last(n.func) == "parameters" and
                       isinstance(n.func, cst.Attribute) and _code(n.func.value) == name and
                       any(_last(c.func) in OPTIMIZERS for c in self.p.ancestors(n) if isinstance(c, cst.Call))
                       for n in self.p.all_nodes()):
                    continue  # its parameters reach an optimizer: trained
                out.append(name)
        return out

    def _inline_kl(self) -> bool:
        """``rewards = scores - coef * (logp - ref_logp)``: a KL term written inline in a reward or loss."""
        a = self.a
        for node, info in self.func_nodes(cst.Assign, cst.AugAssign):
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
                    if self._refuse_unless_reference(a, other, info):
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
                if tgt_code in self.reward_tensor_names() or re.search(r"reward|score|return", tgt_code, re.I) or (
                        re.search(r"reward|score", names, re.I) and not LOSS_RE.search(tgt_code)):
                    out.append(("reward", node, coef))
                elif LOSS_RE.search(tgt_code) or LOSS_RE.search(names):
                    out.append(("loss", node, coef))
                elif isinstance(tgt, cst.Name) and self._flows_to_loss(tgt.value, scope, node):
                    out.append(("loss", node, coef))  # per_token = ... + beta * kl; return per_token.sum() / n
            elif isinstance(node, cst.Return) and node.value is not None and scope is not None:
                coef = self._coef_of(node.value, name)
                if coef is not _MISSING and coef is not None:
                    role = self.result_role(scope)
                    if role is not None:
                        out.append((role, node, coef))
        return out

    def _used_in_loop(self, model: str) -> bool:
        """Does the training loop (or what it calls) run *model*: pass it to a call or call it?"""
        region = [self.main_loop] + [f.node for f in self.callees_closure(self.main_loop)]
        for r in region:
            for n in walk(r):
                if isinstance(n, cst.Call):
                    if _code(n.func).split(".")[0].split("[")[0] == model:
                        return True
                    if any(_code(a.value).split("[")[0] == model for a in n.args):
                        return True
        return False

    def result_role(self, info) -> Optional[str]:
        """'loss' | 'reward' | None: what the value a function returns becomes at its call sites
        (``loss = penalised(...)`` then ``loss.backward()``), or what its name says."""
        for call, caller, _off in self.p.calls_by_callee().get(info.qual, []):
            parent = self.p.parents.get(call)
            if isinstance(parent, cst.Assign):
                tgt = _code(parent.targets[0].target)
                if tgt in self.reward_tensor_names():
                    return "reward"
                if LOSS_RE.search(tgt) or self._backward_on(tgt, caller):
                    return "loss"
            if isinstance(parent, cst.Attribute) and parent.attr.value == "backward":
                return "loss"
        if LOSS_RE.search(info.name):
            return "loss"
        if re.search(r"reward", info.name, re.I):
            return "reward"
        return None

    def _flows_to_loss(self, name: str, scope, after, depth: int = 0) -> bool:
        """Whether *name* (assigned at *after*) reaches what ``backward()`` receives: through later
        assignments of this function, into its return when the caller back-propagates it."""
        if depth > 2:
            return False
        started = False
        for n in walk(scope.node.body if scope is not None else self.p.module):
            if n is after:
                started = True
                continue
            if not started:
                continue
            if isinstance(n, cst.Return) and n.value is not None and name in _names_in(n.value):
                return scope is not None and self.result_role(scope) == "loss"
            if isinstance(n, cst.Assign) and len(n.targets) == 1 and isinstance(n.targets[0].target, cst.Name) \
                    and name in _names_in(n.value) and n.targets[0].target.value != name:
                tgt = n.targets[0].target.value
                if tgt in self.reward_tensor_names() or re.search(r"reward|score|return|adv", tgt, re.I):
                    return False  # into the rewards (and the advantages from them): not a loss term
                if LOSS_RE.search(tgt) or self._backward_on(tgt, scope) or self._flows_to_loss(tgt, scope, n, depth + 1):
                    return True
        return False

    def _backward_on(self, name: str, scope) -> bool:
        body = scope.node if scope is not None else self.p.module
        for n in walk(body):
            if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value == "backward":
                if _code(n.func.value) == name or (n.args and _code(n.args[0].value) == name):
                    return True
        return False

    def reward_tensor_names(self) -> set:
        """Names of the tensor whose groups are normalised into advantages (GRPO): the rewards."""
        if not hasattr(self, "_reward_names"):
            self._reward_names = set()
            self.group_call = None
            if self.find_group_norm() is not None and self.group_call is not None:
                self._reward_names.add(_code(self.group_call.func.value))
        return self._reward_names

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
            return KLMixin._is_kl_ref(node.func.value, name)
        if isinstance(node, cst.Subscript):
            return KLMixin._is_kl_ref(node.value, name)
        if isinstance(node, cst.Call) and _last(node.func) in ("masked_mean", "mean", "sum") and node.args:
            return KLMixin._is_kl_ref(node.args[0].value, name)
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
            t_ev, h_ev = self.p.ev(target, sc), self.p.ev(horizon, sc)
            def num(ev):
                return isinstance(ev, Known) and isinstance(ev.value, (int, float)) and not isinstance(ev.value, bool)
            if name in self.p.classes and not (num(t_ev) and num(h_ev)):
                # the project's own controller: target and horizon are where its update uses them
                # (positional arguments may be a settings object, not the numbers)
                found = self._controller_roles(self.p.classes[name])
                if found is not None:
                    t_ev, h_ev = found
            self.emit("algorithm.kl.target", t_ev, "the KL target")
            self.emit("algorithm.kl.horizon", h_ev, "the KL horizon")
        return self.p.ev(init, sc)

    def _controller_roles(self, cdef):
        """(target Ev, horizon Ev) of an adaptive KL controller class of the project, by the update rule
        ``err = clip(kl / T - 1, -c, c)`` and ``mult = 1 + err * n / H``; None when it is not that rule."""
        for st in cdef.body.body:
            if not isinstance(st, cst.FunctionDef):
                continue
            info = self.p.funcs.get(id(st))
            err_name, target = None, None
            for n in walk(st.body):
                if isinstance(n, cst.Assign) and len(n.targets) == 1 and isinstance(n.targets[0].target, cst.Name):
                    for b in walk(n.value):
                        if isinstance(b, cst.BinaryOperation) and isinstance(b.operator, cst.Subtract) and \
                                _is_one(b.right) and isinstance(b.left, cst.BinaryOperation) and \
                                isinstance(b.left.operator, cst.Divide):
                            err_name, target = n.targets[0].target.value, b.left.right
            if err_name is None:
                continue
            for n in walk(st.body):
                if isinstance(n, (cst.Assign, cst.AugAssign)) and any(isinstance(x, cst.Name) and x.value == err_name
                                                     for x in walk(n.value)):
                    divs = [b for b in walk(n.value) if isinstance(b, cst.BinaryOperation) and
                            isinstance(b.operator, cst.Divide)]
                    if len(divs) == 1:
                        return self.p.ev(target, info), self.p.ev(divs[0].right, info)
        return None

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



def _k3_shape(e) -> bool:
    """``exp(d) - d - 1`` in any order (``torch.exp(d) - 1 - d``, ``d.exp() - d - 1``): the k3 KL estimator
    of a log-ratio d, whatever the variable holding it is called."""
    subtracted = set()
    for n in walk(e):
        if isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Subtract):
            subtracted.add(_code(n.right).strip("() "))
    if not ("1" in subtracted or "1.0" in subtracted):
        return False
    for n in walk(e):
        if isinstance(n, cst.Call) and _last(n.func) == "exp":
            if n.args and len(n.args) == 1:
                arg = n.args[0].value
            elif not n.args and isinstance(n.func, cst.Attribute):
                arg = n.func.value
            else:
                continue
            if _code(arg).strip("() ") in subtracted:
                return True
    return False
