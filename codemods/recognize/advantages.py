"""Advantages: GAE recursion (gamma, lambda), group-normalised rewards (GRPO), whitening."""

from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from .._static import FuncInfo, Known, Record, Runtime, dotted, walk
from .base import (ENTROPY_RE, GEN_RE, LOSS_RE, OLD_NAME_RE, OPTIMIZERS, REF_NAME_RE, REWARD_RE, SCHEDULER_RE,
                   VALUE_LOSS_RE, _MISSING, _call_arg, _code, _factors, _find_modulo, _is_one, _kwarg, _last,
                   _names_in)


MASK_RE = re.compile(r"done|terminal|mask|not_?done|nonterminal|(^|\W)1\s*-\s*\w", re.I)


GAMMA_NAME_RE = re.compile(r"gamma|discount", re.I)
LAM_NAME_RE = re.compile(r"lam|lmbda|lambd", re.I)


def _last_name(node) -> str:
    if isinstance(node, cst.Attribute):
        return node.attr.value
    if isinstance(node, cst.Name):
        return node.value
    return ""


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
            if getattr(self, "group_std_line", None) is not None:
                # the centred group rewards are divided by the group's std
                self.emit("algorithm.norm_adv_by_std", Known(True, self.group_std_line))
        elif gae is not None or value_loss:
            self.emit("algorithm.name", Known("ppo", gae[2] if gae else value_loss))
            if gae is not None:
                self.emit("algorithm.gamma", gae[0], "the discount gamma")
                if len(gae) > 3:
                    pass  # roles not bound by name: both left out (warned in find_gae)
                elif gae[1] is False:
                    self.emit("algorithm.lam", None, "the GAE lambda")
                elif gae[1] is not None:
                    self.emit("algorithm.lam", gae[1], "the GAE lambda")
                else:
                    self.emit("algorithm.lam", Known(1.0, gae[2]))
            if group is not None:
                a.refuse(f"{self.loc(group[1])}: the loop both group-normalises rewards and trains a critic "
                         f"({self.loc(gae[2] if gae else value_loss)}); cannot map it to one advantage estimator "
                         "with certainty; keep either the critic (PPO/GAE) or the group normalisation (GRPO)")
        elif self._probed_estimator():
            pass
        else:
            note = getattr(self, "probe_note", None)
            if note:
                a.warn(f"advantages: the static recognisers decided alone ({note})")
            a.refuse(f"{self.loc(self.p.line(self.main_loop))}: cannot tell how advantages are computed (no GAE "
                     "recursion with a critic and no group-normalised rewards were found); compute them in the "
                     "script as `last = delta + gamma * lam * last` (PPO) or as rewards.view(-1, G) normalised by "
                     "their mean(dim=1) and std(dim=1) (GRPO)")
        # whitening of advantages over the batch (PPO)
        if self.a.config.get("algorithm.name") == "ppo":
            w = self.find_whitening()
            if w is not None:
                self.emit("algorithm.whiten_advantages", Known(True, w))
            else:
                self.emit("algorithm.whiten_advantages", Known(False, self.p.line(self.main_loop)))

    def _probed_estimator(self) -> bool:
        """The estimator identified by running its block (recognize/probe.py); True when one was emitted."""
        found = self.probe_advantages()
        if found is None:
            return False
        name, std, line, detail = found
        self.emit("algorithm.name", Known(name, line))
        if name == "grpo" and std is not None:
            self.emit("algorithm.norm_adv_by_std", Known(bool(std), line))
        elif name == "grpo":
            flag, node = getattr(self, "probe_flag", ("a flag", None))
            self.a.unmapped.append(f"algorithm.norm_adv_by_std: `if {flag}:` at {self.loc(line)} decides at run time "
                                   "whether the group advantages are divided by their std")
        self.a.warn(f"advantages: identified by running the block at {self.loc(line)} on synthetic rewards in a "
                    f"sandbox: {detail} ({name}{'' if name != 'grpo' or std is None else ', norm_adv_by_std ' + str(bool(std))})")
        pg = getattr(self, "probe_group", None)
        g = self._group_in(self.main_loop) if pg is None else None
        if pg is not None:
            # the block's input that acted as the group size when its output matched the estimator
            self.emit("algorithm.group_size", pg[0], "the group size")
        elif g is not None:
            self.emit("algorithm.group_size", self.p.ev(g[0], g[1]), "the group size")
        else:
            self.a.warn("algorithm.group_size is left out: the number of responses per prompt was not found "
                        "as a static value")
        return True

    def find_gae(self):
        """(gamma Ev, lam Ev | None, line) from ``last = delta + g * l * [mask *] last`` and
        ``delta = r + g * v' [* mask] - v``. Done/terminal masks are not coefficients; a product
        whose coefficients cannot be told apart (``gl = gamma * lam`` precomputed) proves nothing."""
        # inside functions, or at module level / under `if __name__ == "__main__":` (info None)
        for node, info in self.p.nodes_of(cst.Assign):
            if not isinstance(node, cst.Assign):
                continue
            tnames = set()
            for t in node.targets:
                tgt = t.target
                if isinstance(tgt, cst.Name):
                    tnames.add(tgt.value)
                elif isinstance(tgt, cst.Subscript):
                    tnames.add(_code(tgt.value))
            if not tnames:
                continue
            value = node.value
            if not isinstance(value, cst.BinaryOperation) or not isinstance(value.operator, cst.Add):
                continue
            for delta, prod in ((value.left, value.right), (value.right, value.left)):
                factors = _factors(prod)
                if len(factors) < 2:
                    continue
                rec = [f for f in factors if tnames & set(_names_in(f)) or any(_code(f).startswith(t) for t in tnames)]
                if not rec:
                    continue
                rest = [f for f in factors if f not in rec]
                consts = [f for f in rest if not MASK_RE.search(_code(f))]
                gamma_node = self._gamma_in_delta(delta, info)
                if len(consts) == 2:
                    # roles are bound by name (gamma / lam) or by the discount inside delta, never by position
                    g = None
                    if gamma_node is not None:
                        g = next((c for c in consts if _code(c) == _code(gamma_node)), None)
                    if g is None:
                        named = [c for c in consts if GAMMA_NAME_RE.search(_last_name(c))]
                        lamed = [c for c in consts if LAM_NAME_RE.search(_last_name(c))]
                        if len(named) == 1 and named[0] not in lamed:
                            g = named[0]  # gamma named; the other factor is lambda
                        elif len(lamed) == 1 and lamed[0] not in named:
                            g = consts[1] if lamed[0] is consts[0] else consts[0]
                    if g is None:
                        self.a.warn(f"{self.loc(self.p.line(node))}: GAE recursion `{_code(node.value)}`: which "
                                    "factor is gamma and which is lambda is not bound by name; algorithm.gamma and "
                                    "algorithm.lam are left out")
                        return (None, None, self.p.line(node), "unbound")
                    l = consts[1] if g is consts[0] else consts[0]
                    lam = self.p.ev(l, info)
                    # a lambda factor whose value is not static is NOT "no lambda" (1.0): False = left out
                    return (self.p.ev(g, info), lam if lam is not None else False, self.p.line(node))
                if len(consts) == 1 and gamma_node is not None and _code(consts[0]) != _code(gamma_node):
                    continue
                tname = " ".join(tnames).lower()
                if len(consts) == 1 and (gamma_node is not None or "return" in tname or tname == "ret"):
                    return (self.p.ev(consts[0], info), None, self.p.line(node))
        return None

    def _gamma_in_delta(self, delta, info):
        names = []
        assigns = info.assigns if info is not None else self.p.module_assigns
        if isinstance(delta, cst.Name):
            names = [e for e in assigns.get(delta.value, []) if e is not None]
        elif isinstance(delta, cst.Subscript) and isinstance(delta.value, cst.Name):
            names = [e for e in assigns.get(delta.value.value, []) if e is not None]
            for n in walk(info.node.body if info is not None else self.p.module):
                if isinstance(n, cst.Assign) and isinstance(n.targets[0].target, cst.Subscript) and _code(n.targets[0].target.value) == delta.value.value:
                    names.append(n.value)
        else:
            names = [delta]
        for e in names:
            for n in walk(e):
                if isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Multiply):
                    factors = [f for f in _factors(n) if not MASK_RE.search(_code(f))]
                    values = [f for f in factors if re.search(r"value|next|v_|values|vpred", _code(f), re.I)]
                    coefs = [f for f in factors if f not in values and isinstance(f, (cst.Name, cst.Attribute, cst.Float, cst.Integer))]
                    if values and len(coefs) == 1:
                        return coefs[0]
        return None

    def find_group_norm(self):
        """(group size Ev, line) for rewards reshaped to ``(-1, G)`` and normalised within each group:
        the reshaped tensor's ``mean`` and ``std`` over dim 1 (or -1). Decided by the data flow, not by
        what the tensor is called."""
        for call, scope in self.calls:
            last = _last(call.func)
            if last not in ("view", "reshape", "unflatten") or not isinstance(call.func, cst.Attribute):
                continue
            args = [x.value for x in call.args if x.keyword is None]
            if last == "unflatten" and len(args) == 2 and isinstance(args[1], cst.Tuple):
                args = [e.value for e in args[1].elements]
            if len(args) != 2:
                continue
            if not (isinstance(args[0], cst.UnaryOperation) and _code(args[0]) == "-1") and \
                    not self._rows_of(args[0], args[1], scope):
                continue
            parent = self.p.parents.get(call)
            names = {_code(call)}
            if isinstance(parent, cst.Assign):
                names |= {_code(t.target) for t in parent.targets}
            if not self._normalised_per_row(scope.node if scope is not None else self.p.module, names):
                continue
            recv = call.func.value
            self.group_call = call
            if scope is not None:  # the function turning rewards into advantages is not the reward
                self.advantage_funcs = getattr(self, "advantage_funcs", set()) | {id(scope.node)}
            if self._divides_by_row_std(scope.node if scope is not None else self.p.module, names, scope):
                self.group_std_line = self.p.line(call)
            if isinstance(recv, cst.Name):
                self.reward_exprs = [(e, scope) for e in self.p.assignments_of(recv.value, scope) if e is not None]
            return (self.p.ev(args[1], scope), self.p.line(call))
        return self.find_prompt_groups()

    def find_prompt_groups(self):
        """(group size Ev, line) for rewards normalised per prompt: inside a loop over the prompts of a
        step, one prompt's G responses (``.repeat(G, 1)`` / ``num_return_sequences=G``) are generated and
        their rewards normalised by their own ``mean()`` and ``std()`` (tiny-GRPO style)."""
        for node, scope in self.p.nodes_of(cst.BinaryOperation):
            if not isinstance(node.operator, cst.Divide) or not _is_centered(node):
                continue
            sites = [(node, scope)]
            if scope is not None and _returns(scope, node):
                sites = [(c, caller) for c, caller, _ in self.p.calls_by_callee().get(scope.qual, [])]
            for site, site_scope in sites:
                inner = self._inner_prompt_loop(site, site_scope)
                if inner is None:
                    continue
                g = self._group_in(inner)
                if g is not None:
                    ev = self.p.ev(g[0], g[1])
                    n = f"{_code(g[0])} = {ev.value}" if isinstance(ev, Known) else _code(g[0])
                    self.a.warn(f"{self.loc(self.p.line(inner))}: each prompt's responses ({n}) are generated and "
                                "their rewards normalised together in this loop over prompts: that is GRPO's group "
                                "normalisation, algorithm.group_size is that number")
                    self.group_std_line = self.p.line(node)  # _is_centered: divided by the std
                    return (ev, self.p.line(site))
        return None

    def _rows_of(self, rows, g, scope) -> bool:
        """``x.view(n_groups, G)`` with ``n_groups = len(x) // G`` (or ``N // G`` inline): the row count is
        the length divided by the group size, so each row is one group, as with ``view(-1, G)``."""
        for _ in range(2):
            if isinstance(rows, cst.Name):
                exprs = [e for e in self.p.assignments_of(rows.value, scope) if e is not None]
                if len(exprs) != 1:
                    return False
                rows = exprs[0]
        return isinstance(rows, cst.BinaryOperation) and isinstance(rows.operator, (cst.FloorDivide, cst.Divide)) \
            and _code(rows.right) == _code(g)

    def _divides_by_row_std(self, func_node, names, scope) -> bool:
        """A division whose divisor holds ``g.std(dim=1)`` (or -1) of the grouped rewards *g*, in code that
        runs (not under an ``if`` whose test is unknown or false: ``if normalize_by_std:``)."""
        for n in walk(func_node):
            if isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Divide):
                if self.settled_runs(n, func_node, scope) is not True:
                    continue
                divisor = [n.right]
                for nm in walk(n.right):  # group_stds = g.std(dim=1); ... / (group_stds + eps)
                    if isinstance(nm, cst.Name):
                        exprs = [e for e in self.p.assignments_of(nm.value, scope) if e is not None]
                        if len(exprs) == 1:
                            divisor.append(exprs[0])
                for m in (x for d in divisor for x in walk(d)):
                    if isinstance(m, cst.Call) and isinstance(m.func, cst.Attribute) and m.func.attr.value == "std" \
                            and _code(m.func.value) in names:
                        return True
        return False

    def _inner_prompt_loop(self, node, scope):
        """The loop inside the training loop (or a function it calls) that holds *node* and generates."""
        for anc in self.p.ancestors(node):
            if isinstance(anc, cst.For) and anc is not self.main_loop and "gen" in self.reach(anc):
                if any(a is self.main_loop for a in self.p.ancestors(anc)) or \
                        self._reached_from_loop(self.p.func_of(anc)):
                    return anc
            if isinstance(anc, cst.FunctionDef):
                return None
        return None

    def _group_in(self, loop):
        """(G node, scope) from ``x.repeat(G, 1)``, ``repeat_interleave(G)`` or ``num_return_sequences=G``
        in the loop or the functions it calls (a parameter is bound through the call site)."""
        region = [(loop, self.p.func_of(loop))] + [(f.node, f) for f in self.callees_closure(loop)]
        for r, sc in region:
            for n in walk(r):
                if isinstance(n, (cst.ListComp, cst.GeneratorExp)) and isinstance(n.elt, cst.Call) and \
                        n.for_in.inner_for_in is None and isinstance(n.for_in.iter, cst.Call) and \
                        _last(n.for_in.iter.func) == "range" and len(n.for_in.iter.args) == 1:
                    # [rollout(...) for _ in range(G)]: G responses of one prompt
                    t = self.p.resolve_callee(n.elt, self.p.func_of(n))
                    if "gen" in self.call_tags(n.elt) or (t is not None and "gen" in self.reach(t[0].node)):
                        return (n.for_in.iter.args[0].value, self.p.func_of(n))
                if not isinstance(n, cst.Call) or not isinstance(n.func, cst.Attribute):
                    continue
                last = n.func.attr.value
                g = None
                if last == "repeat" and len(n.args) == 2 and _code(n.args[1].value) == "1":
                    g = n.args[0].value
                elif last == "repeat_interleave" and n.args:
                    # torch.repeat_interleave(x, G) names the tensor first; x.repeat_interleave(G) does not
                    fn_form = isinstance(n.func.value, cst.Name) and n.func.value.value in ("torch", "np", "numpy")
                    g = _call_arg(n, 1, "repeats") if fn_form else n.args[0].value
                elif "gen" in self.call_tags(n):
                    g = _kwarg(n, "num_return_sequences")
                if g is not None:
                    return (g, self.p.func_of(n))
        return None

    @staticmethod
    def _normalised_per_row(func_node, names) -> bool:
        mean = std = False
        for n in walk(func_node):
            if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value in ("mean", "std"):
                if _code(n.func.value) not in names:
                    continue
                dim = _call_arg(n, 0, "dim")
                if dim is not None and _code(dim).replace(" ", "") in ("1", "-1"):
                    if n.func.attr.value == "mean":
                        mean = True
                    else:
                        std = True
        return mean and std

    def has_value_loss(self):
        for node, info in self.func_nodes(cst.Assign):
            if isinstance(node, cst.Assign) and isinstance(node.targets[0].target, cst.Name):
                if VALUE_LOSS_RE.search(node.targets[0].target.value):
                    return self.p.line(node)
        return None

    def find_whitening(self):
        for node, info in self.p.nodes_of(cst.Assign, cst.Call):
            if isinstance(node, cst.Assign) and isinstance(node.targets[0].target, cst.Name):
                t = node.targets[0].target.value
                code = _code(node.value).replace(" ", "")
                if re.search(r"adv", t, re.I) and re.search(r"\.mean\(\)", code) and re.search(r"\.std\(\)", code):
                    return self.p.line(node)
            if isinstance(node, cst.Call) and (_last(node.func) or "") in ("whiten", "masked_whiten") and \
                    not (node.args and re.search(r"reward|score", _code(node.args[0].value), re.I)):
                return self.p.line(node)  # (whitening the rewards is not whitening the advantages)
            if isinstance(node, cst.Call) and any(re.search(r"adv", _code(a.value), re.I) for a in node.args):
                # a helper of the program that returns (x - x.mean()) / (x.std() + eps), given advantages
                t = self.p.resolve_callee(node, info)
                if t is not None and any(isinstance(b, cst.BinaryOperation) and isinstance(b.operator, cst.Divide)
                                         and _is_centered(b) and _returns(t[0], b) for b in walk(t[0].node.body)):
                    return self.p.line(node)
        return None


def _is_centered(div) -> bool:
    """``(x - x.mean()) / (x.std() + eps)`` or ``/ x.std()``: whole-tensor normalisation."""
    left = div.left
    if not (isinstance(left, cst.BinaryOperation) and isinstance(left.operator, cst.Subtract)):
        return False
    mean = left.right
    if not (isinstance(mean, cst.Call) and isinstance(mean.func, cst.Attribute) and mean.func.attr.value == "mean"
            and not mean.args and _code(mean.func.value) == _code(left.left)):
        return False
    x = _code(left.left)
    return any(isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value == "std"
               and not n.args and _code(n.func.value) == x for n in walk(div.right))


def _returns(info, node) -> bool:
    for r in walk(info.node.body):
        if isinstance(r, cst.Return) and r.value is not None and any(n is node for n in walk(r.value)):
            return True
    return False
