"""The clipped-ratio objective and the loss coefficients (value loss, entropy)."""

from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from .._static import FuncInfo, Known, Record, Runtime, dotted, walk
from .base import (ENTROPY_RE, GEN_RE, LOSS_RE, OLD_NAME_RE, OPTIMIZERS, REF_NAME_RE, REWARD_RE, SCHEDULER_RE,
                   VALUE_LOSS_RE, _MISSING, _call_arg, _code, _factors, _find_modulo, _is_one, _kwarg, _last,
                   _names_in)


class ClipLossMixin:
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
            elif self._is_prob_ratio(x, scope):
                # clamp(ratio, 0.8, 1.2): bounds around 1 of a probability ratio exp(new - old)
                lv, hv = self.p.ev(lo, scope), self.p.ev(hi, scope)
                if isinstance(lv, Known) and isinstance(hv, Known) and all(
                        isinstance(v.value, (int, float)) and not isinstance(v.value, bool) for v in (lv, hv)) and \
                        0 < lv.value < 1 < hv.value:
                    out.append(("ratio_abs", call, scope, x, Known(round(1 - lv.value, 12), lv.line),
                                Known(round(hv.value - 1, 12), hv.line)))
        return [c for c in out if c[0] in ("ratio", "ratio_abs")] if not hasattr(self, "_all_clips") else out

    def _is_prob_ratio(self, x, scope) -> bool:
        """*x* is ``exp(a - b)`` / ``(a - b).exp()`` (directly or through its one assignment)."""
        if isinstance(x, cst.Name):
            exprs = [e for e in self.p.assignments_of(x.value, scope) if e is not None]
            if len(exprs) != 1:
                return False
            x = exprs[0]
        if not (isinstance(x, cst.Call) and _last(x.func) == "exp"):
            return False
        arg = x.args[0].value if x.args else (x.func.value if isinstance(x.func, cst.Attribute) else None)
        return isinstance(arg, cst.BinaryOperation) and isinstance(arg.operator, cst.Subtract)

    def all_clips(self) -> list:
        self._all_clips = True
        try:
            return self.ratio_clips()
        finally:
            del self._all_clips

    # ------------------------------------------------------------------ loss coefficients
    def extract_loss_coefs(self) -> None:
        # in functions and at module level / under the __main__ guard (info None)
        for node, info in self.p.nodes_of(cst.Assign, cst.AugAssign, cst.Return):
            if not isinstance(node, (cst.Assign, cst.AugAssign, cst.Return)):
                continue
            if isinstance(node, cst.Return):
                if info is None:
                    continue
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


    def _never_runs(self, node, scope) -> bool:
        """*node* sits in a branch the script's values never take, or in a function every call of which
        does (``elif loss_type == "grpo_clip": return clip_loss(...)`` with loss_type defaulting to
        another objective). Unknown tests count as live."""
        if self.statically_dead(node, scope):
            return True
        if scope is None or scope.parent is not None:
            return False
        sites = self.p.calls_by_callee().get(scope.qual, [])
        return bool(sites) and not self.p._used_as_value(scope) and \
            all(self.statically_dead(site, caller) for site, caller, _ in sites)

    def extract_clip(self) -> None:
        a = self.a
        # clip ratio
        lows, highs = [], []
        # the 1 - eps / 1 + eps form first: it names the range; literal bounds around 1 only when alone
        for kind, call, scope, x, lo, hi in sorted(self.all_clips(), key=lambda c: c[0] == "ratio_abs"):
            if self._never_runs(call, scope):
                continue  # e.g. the clipped loss of a `loss_type` the script's defaults do not select
            if kind == "ratio":
                lows.append(self.p.ev(lo, scope))
                highs.append(self.p.ev(hi, scope))
            elif kind == "ratio_abs":
                lows.append(lo)
                highs.append(hi)
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
