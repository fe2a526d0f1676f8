"""Advantages: GAE recursion (gamma, lambda), group-normalised rewards (GRPO), whitening."""

from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from .._static import FuncInfo, Known, Record, Runtime, dotted, walk
from .base import (ENTROPY_RE, GEN_RE, LOSS_RE, OLD_NAME_RE, OPTIMIZERS, REF_NAME_RE, REWARD_RE, SCHEDULER_RE,
                   VALUE_LOSS_RE, _MISSING, _call_arg, _code, _factors, _find_modulo, _is_one, _kwarg, _last,
                   _names_in)


class AdvantagesMixin:
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

