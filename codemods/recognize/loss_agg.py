"""Behaviour, not spelling: ``algorithm.loss_agg_mode`` from running the statements that reduce the
masked per-token loss to the scalar that ``backward()`` receives.

The recogniser finds a statement that multiplies a tensor by a mask (``(x * mask).sum(-1)``,
``x * labels_mask``) or hands both to a local helper (``masked_mean(x, mask, dim=-1)``), follows the
value forward through the statements that transform it (in its function, and through ``return`` into
the caller, up to three levels) until a ``.backward()`` receives it, and runs only those statements,
with the project's pure helpers they call, in the sandbox of :mod:`probe` on a synthetic ragged batch.
The scalar is compared, up to a constant factor (``/ gradient_accumulation_steps``, a sum over
micro-batches), with verl_bridge's three aggregations: token-mean, seq-mean-token-sum,
seq-mean-token-mean. Other names the statements read are tried as 0 (an added term such as a KL
penalty) and 1 (a factor); a divisor that counts tokens (``num_target_tokens``,
``total_response_len``) is the batch's token count. Different readings that disagree leave the key out.
"""

from __future__ import annotations

import itertools
import math
import re
from typing import Optional

import libcst as cst

from .._static import Known, walk
from .base import _code, _last
from .probe import BUILTINS, MODULE_ALIASES, PURE_CALLS, _loads, _pure, run_sandboxed

MASK_RE = re.compile(r"mask", re.I)
COUNT_RE = re.compile(r"tok|len|count|mask|num_|n_", re.I)
RESHAPES = {"view", "reshape", "flatten", "squeeze", "unsqueeze", "contiguous", "to", "float", "cpu", "detach"}

RUNNER = r'''
import itertools, json, math, sys
import torch
spec = json.loads(sys.stdin.read())
torch.manual_seed(0)
X = [torch.tensor([[0.3, -1.2, 0.7, 2.1, -0.4], [1.5, 0.2, -0.9, 0.6, 1.1], [-0.8, 0.9, 1.7, -0.3, 0.5]]),
     torch.tensor([[1.1, 0.4, -0.2, 0.8, 1.9], [-0.6, 1.3, 0.5, -1.4, 0.2], [0.7, -0.5, 0.1, 1.2, -1.0]])]
LENS = [[5, 2, 4], [1, 5, 3]]
def mask(lens, dtype):
    m = torch.zeros(3, 5, dtype=dtype)
    for i, n in enumerate(lens):
        m[i, :n] = 1
    return m
class V(float):
    """An unknown name: a number whose every attribute, item or call result is itself (self.beta, cfg.coef,
    entropy.item())."""
    def __getattr__(self, k):
        if k.startswith("__"):
            raise AttributeError(k)
        return self
    def __getitem__(self, k):
        return self
    def __call__(self, *a, **k):
        return self  # metric side computations: entropy.item(), kl.sum()
code = compile(spec["code"], "<loss-agg>", "exec")
out = []
names = spec["unknowns"]
for combo in itertools.product(*[spec["cands"][n] for n in names]):
    for dtype in ("float", "bool"):
        outs = []
        for xi, li in ((0, 0), (1, 0), (0, 1), (1, 1)):
            m = mask(LENS[li], torch.float32 if dtype == "float" else torch.bool)
            env = {"torch": torch, "math": math, "F": torch.nn.functional, "__x": X[xi].clone().requires_grad_(False)}
            env.update(spec["consts"])
            env[spec["x"]] = X[xi].clone()
            env[spec["m"]] = m
            for n, c in zip(names, combo):
                env[n] = m.float().sum() if c == "count" else V(c)
            try:
                run_limited(code, env)
                v = env["__out"]
                v = v.detach().double() if isinstance(v, torch.Tensor) else torch.tensor(float(v), dtype=torch.float64)
                if v.numel() != 1:
                    raise ValueError("not a scalar")
                outs.append(float(v))
            except Exception:
                outs = None
                break
        if outs is not None:
            out.append({"combo": dict(zip(names, combo)), "outs": outs})
            break
print(json.dumps(out))
'''

X = [[[0.3, -1.2, 0.7, 2.1, -0.4], [1.5, 0.2, -0.9, 0.6, 1.1], [-0.8, 0.9, 1.7, -0.3, 0.5]],
     [[1.1, 0.4, -0.2, 0.8, 1.9], [-0.6, 1.3, 0.5, -1.4, 0.2], [0.7, -0.5, 0.1, 1.2, -1.0]]]
LENS = [[5, 2, 4], [1, 5, 3]]


def _refs(x, lens) -> dict:
    sums = [sum(row[:n]) for row, n in zip(x, lens)]
    return {"token-mean": sum(sums) / sum(lens),
            "seq-mean-token-sum": sum(sums) / len(lens),
            "seq-mean-token-mean": sum(s / n for s, n in zip(sums, lens)) / len(lens)}


def classify_agg(outs: list) -> Optional[str]:
    """The aggregation whose value on the four synthetic (x, mask) pairs is the output up to one
    constant non-zero factor, or None."""
    pairs = [(0, 0), (1, 0), (0, 1), (1, 1)]
    hits = []
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"):
        ratios = []
        for (xi, li), o in zip(pairs, outs):
            ref = _refs(X[xi], LENS[li])[mode]
            if abs(ref) < 1e-9 or not math.isfinite(o):
                ratios = None
                break
            ratios.append(o / ref)
        if ratios and abs(ratios[0]) > 1e-9 and all(abs(r - ratios[0]) <= 1e-5 * abs(ratios[0]) for r in ratios):
            hits.append(mode)
    return hits[0] if len(hits) == 1 else None


class LossAggMixin:
    def probe_loss_aggregation(self) -> None:
        if "algorithm.loss_agg_mode" in self.a.config:
            return
        region = self.loop_region(self.main_loop)
        modes: dict = {}
        for r in region:
            info = self.p.funcs.get(id(r)) if isinstance(r, cst.FunctionDef) else self.loop_func
            body = r if isinstance(r, cst.FunctionDef) else r
            for stmt in self._agg_statements(body):
                start = self._agg_start(stmt, info)
                if start is None:
                    continue
                self._agg_helpers = {}
                got = self._agg_chain(stmt, start, body, info)
                if got is None:
                    continue
                res = self._agg_run(got, info)
                if res is not None:
                    modes.setdefault(res, (stmt, self._agg_used_count))
            if len(modes) > 1:
                break
        if len(modes) != 1:
            if len(modes) > 1:
                self.a.warn("algorithm.loss_agg_mode is left out: the loss is reduced in more than one way "
                            f"({', '.join(sorted(modes))})")
            return
        mode, (stmt, used_count) = next(iter(modes.items()))
        micro = self.a.config.get("algorithm.micro_batch_size")
        mini = self.a.config.get("algorithm.mini_batch_size")
        if mode == "token-mean" and not used_count and micro == 1:
            # a token mean over micro-batches of one sequence, gradients accumulated: per-sequence mean
            mode = "seq-mean-token-mean"
        elif mode == "token-mean" and not used_count and micro is not None and micro != mini:
            # each micro-batch divided by its own token count, gradients accumulated: no canonical mode
            self.a.warn(f"algorithm.loss_agg_mode is left out: the loss at {self.loc(self.p.line(stmt))} is a token "
                        "mean within each micro-batch and the gradients of several micro-batches are accumulated")
            return
        self.emit("algorithm.loss_agg_mode", Known(mode, self.p.line(stmt)))
        self.a.warn(f"algorithm.loss_agg_mode: the statements that reduce the masked loss from "
                    f"{self.loc(self.p.line(stmt))} to the value given to backward() ran on a ragged synthetic batch "
                    f"in the sandbox and matched {mode} (up to a constant factor)")

    # ------------------------------------------------------------------ pieces
    @staticmethod
    def _agg_statements(body) -> list:
        out = []
        for n in walk(body):
            if isinstance(n, cst.SimpleStatementLine):
                out.extend(s for s in n.body if isinstance(s, (cst.Assign, cst.AugAssign, cst.Return, cst.Expr)))
        return out

    def _agg_start(self, stmt, info) -> Optional[tuple]:
        """(x, mask) names when *stmt* multiplies a tensor by a mask or hands both to a local helper."""
        if not isinstance(stmt, (cst.Assign, cst.AugAssign, cst.Return)) or stmt.value is None:
            return None
        for n in walk(stmt.value):
            if isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Multiply):
                for a, b in ((n.left, n.right), (n.right, n.left)):
                    # whatever the mask multiplies is the per-token loss
                    if isinstance(b, cst.Name) and MASK_RE.search(b.value) and not \
                            any(isinstance(y, cst.Name) and MASK_RE.search(y.value) for y in walk(a)):
                        return a, b.value
            if isinstance(n, cst.Call):
                pos = [x.value for x in n.args if x.keyword is None and not x.star]
                if len(pos) >= 2 and isinstance(pos[0], cst.Name) and isinstance(pos[1], cst.Name) and \
                        MASK_RE.search(pos[1].value) and self._agg_helper(n, info) is not None:
                    return pos[0], pos[1].value
        return None

    def _agg_helper(self, call, info) -> Optional[tuple]:
        """(name used at the call, source) of a pure local function the call reaches, or None."""
        t = self.p.resolve_callee(call, info)
        if t is None:
            return None
        f = t[0]
        if f.cls is not None:
            return None
        for n in walk(f.node.body):
            if isinstance(n, (cst.Assign, cst.AugAssign, cst.Return)) and n.value is not None and not _pure(n.value):
                return None
            if isinstance(n, (cst.For, cst.While, cst.With, cst.Try)):
                return None
        # annotations (Optional[torch.Tensor], jaxtyping shapes) name things the sandbox does not import
        ps = f.node.params
        strip = lambda lst: [x.with_changes(annotation=None) for x in lst]
        star = ps.star_arg.with_changes(annotation=None) if isinstance(ps.star_arg, cst.Param) else ps.star_arg
        node = f.node.with_changes(returns=None, params=ps.with_changes(
            params=strip(ps.params), kwonly_params=strip(ps.kwonly_params), posonly_params=strip(ps.posonly_params),
            star_arg=star, star_kwarg=ps.star_kwarg.with_changes(annotation=None) if ps.star_kwarg else None))
        return f.name, cst.Module([]).code_for_node(node)

    def _agg_chain(self, start, xm, body, info, depth: int = 0, lines=None, names=None):
        """The statements from *start* to the ``backward()`` that receives the value (through returns),
        or None. Returns (code, x, mask, whether a token-count divisor was used)."""
        x, m = xm
        if not isinstance(x, str):
            # the start: the expression the mask multiplies becomes the synthetic per-token loss
            start_node = start.deep_replace(x, cst.Name("__xtok"))
            start_code = _code(start_node)
            x = "__xtok"
        else:
            start_node, start_code = start, None
        stmts = self._agg_statements(body)
        idx = next((i for i, s in enumerate(stmts) if s is start), None)
        if idx is None:
            return None
        lines = list(lines or [])
        live = set(names or ()) | {x}
        first = True
        for s in stmts[idx:]:
            reads = set(_loads(s.value)) if getattr(s, "value", None) is not None else set()
            if isinstance(s, cst.AugAssign):
                reads |= set(_loads(s.target))
            if not first and not (reads & live):
                continue
            ok = self.settled_runs(s, body, info)
            if ok is False:
                continue
            if ok is None and not first and _backward_of(s) is None and self._only_reads(s, body, info, live):
                continue  # a guard that only reads the value (`if not loss.isfinite(): print(loss)`)
            if ok is None:
                return None
            first = False
            back = _backward_of(s)
            if back is not None:
                if back in live:
                    return self._agg_finish(lines, back, x, m, info)
                continue
            if isinstance(s, cst.Expr):
                continue
            if not all((_last(c.func) or "") in PURE_CALLS or self._agg_helper(c, info) is not None
                       for c in walk(s.value) if isinstance(c, cst.Call)):
                # something the sandbox cannot run: fine when it only reads the value (its .device);
                # not when it replaces a value the chain carries
                if isinstance(s, cst.Return) or _stmt_targets(s) & live:
                    return None
                continue
            for c in walk(s.value):
                if isinstance(c, cst.Call):
                    h = self._agg_helper(c, info)
                    if h is not None:
                        self._agg_helpers[_code(c.func)] = h
            if isinstance(s, cst.Return):
                rv = (start_node if s is start else s).value
                if isinstance(rv, cst.Tuple):
                    # only the returned elements that carry the value: the others are None
                    keep = [i for i, e in enumerate(rv.elements) if set(_loads(e.value)) & live]
                    parts = [_code(e.value) if i in keep else "None" for i, e in enumerate(rv.elements)]
                    lines.append(f"__ret{depth} = ({', '.join(parts)},)")
                else:
                    keep = None
                    lines.append(f"__ret{depth} = {_code(rv)}")
                return self._agg_return(keep, lines, x, m, info, depth)
            if isinstance(s, cst.AugAssign):
                tgt = _code(s.target)
                if tgt not in live and s is not start:
                    continue
                if not (set(_loads(s.value)) & live) and s is not start and isinstance(s.operator, (cst.AddAssign, cst.SubtractAssign)):
                    continue  # another term added to the loss (a KL penalty): not the aggregation
                lines.append(start_code if s is start and start_code else _code(s))
                live.add(tgt)
                continue
            tg = [t.target for t in s.targets]
            if not all(isinstance(t, cst.Name) for t in tg):
                continue  # metrics["loss"] = loss
            if isinstance(s.value, cst.Call) and isinstance(s.value.func, cst.Attribute) and \
                    s.value.func.attr.value in RESHAPES and isinstance(s.value.func.value, cst.Name) and \
                    s.value.func.value.value in live:
                lines.append(f"{tg[0].value} = {s.value.func.value.value}")  # a reshape keeps every element
            else:
                lines.append(start_code if s is start and start_code else _code(s))
            for t in tg:
                live.add(t.value)
        return None

    def _agg_return(self, keep, lines, x, m, info, depth):
        if depth >= 3 or info is None:
            return None
        # the value leaves the function: follow it at each call site in the loop's region
        for call, caller, _ in self.p.calls_by_callee().get(info.qual, []):
            stmt = next((a for a in self.p.ancestors(call) if isinstance(a, (cst.Assign,))), None)
            if stmt is None or stmt.value is not call:
                continue
            tgt = stmt.targets[0].target
            if isinstance(tgt, cst.Name):
                recv = [tgt.value]
            elif isinstance(tgt, (cst.Tuple, cst.List)) and all(isinstance(e.value, cst.Name) for e in tgt.elements):
                recv = [e.value.value for i, e in enumerate(tgt.elements) if keep is None or i in keep]
            else:
                continue
            body = caller.node if caller is not None else self._module_body_of(stmt)
            if body is None:
                continue
            recv_code = _code(tgt) if isinstance(tgt, cst.Name) else \
                "(" + ", ".join(e.value.value if e.value.value in recv else "__drop" for e in tgt.elements) + ",)"
            got = self._agg_chain_after(stmt, body, caller, lines + [f"{recv_code} = __ret{depth}"], recv, x, m,
                                        depth + 1)
            if got is not None:
                return got
        return None

    def _module_body_of(self, stmt):
        loop = self.main_loop
        return loop if any(a is loop for a in self.p.ancestors(stmt)) else None

    def _agg_chain_after(self, stmt, body, info, lines, recv, x, m, depth):
        stmts = self._agg_statements(body)
        idx = next((i for i, s in enumerate(stmts) if s is stmt), None)
        if idx is None or idx + 1 >= len(stmts):
            return None
        live = set(recv)
        for s in stmts[idx + 1:]:
            back = _backward_of(s)
            if back is not None and back in live:
                return self._agg_finish(lines, back, x, m, info)
            reads = set(_loads(s.value)) if getattr(s, "value", None) is not None else set()
            if reads & live and back is None and self._only_reads(s, body, info, live):
                continue  # print(loss) / logging, also under `if not loss.isfinite():`: the value is unchanged
            if reads & live:
                return self._agg_chain(s, (x, m), body, info, depth, lines, live)
        return None

    def _only_reads(self, s, body, info, live) -> bool:
        """A statement that reads the carried value without replacing it: an expression statement (a
        print or a metric call), or any statement under a run-time test that binds none of its names."""
        if isinstance(s, cst.Expr):
            return True
        if isinstance(s, cst.Return):
            return False
        return self.settled_runs(s, body, info) is None and not (_stmt_targets(s) & live)

    def _agg_finish(self, lines, back, x, m, info):
        lines = lines + [f"__out = {back}"]
        code = "\n".join(lines) + "\n"
        helpers = self.__dict__.get("_agg_helpers", {})
        pre = []
        for called, (fname, src) in helpers.items():
            pre.append(src)
            if "." in called:
                mod = called.split(".")[0]
                pre.append(f"import types as __t\n{mod} = __t.SimpleNamespace({fname}={fname})")
        code = "\n".join(pre) + "\n" + code
        try:
            mod = cst.parse_module(code)
        except Exception:
            return None
        bound = {x, m} | {h.split(".")[0] for h in helpers} | {f for f, _ in helpers.values()}
        assigned, free = set(), []
        for st in mod.body:
            if isinstance(st, (cst.FunctionDef,)):
                continue
            for small in getattr(st, "body", []):
                if isinstance(small, (cst.Assign, cst.AugAssign, cst.Import)):
                    val = getattr(small, "value", None)
                    if val is not None:
                        for nm in _loads(val):
                            if nm not in assigned and nm not in bound and nm not in free:
                                free.append(nm)
                    if isinstance(small, cst.AugAssign):
                        tg = _code(small.target)
                        if tg not in assigned and tg not in bound and tg not in free:
                            free.append(tg)
                    else:
                        for t in getattr(small, "targets", []):
                            for nm in _loads(t.target):
                                assigned.add(nm)
        free = [n for n in free if n not in BUILTINS and n not in MODULE_ALIASES and not n.startswith("__")]
        return code, free, x, m

    def _agg_run(self, block, info) -> Optional[str]:
        code, free, x, m = block
        consts, cands = {}, {}
        for nm in free:
            ev = self.p.ev_param(info, nm) if info is not None and nm in info.params else self.p.ev(cst.Name(nm), info)
            if isinstance(ev, Known) and isinstance(ev.value, (int, float)) and not isinstance(ev.value, bool):
                consts[nm] = ev.value
            elif self._agg_divisor(code, nm) and COUNT_RE.search(nm):
                cands[nm] = ["count"]
            else:
                cands[nm] = [0.0, 1.0]
        if len(cands) > 4:
            return None
        res = run_sandboxed(RUNNER, {"code": code, "x": x, "m": m, "consts": consts, "unknowns": list(cands),
                                     "cands": cands})
        if not res:
            return None
        found = {classify_agg(r["outs"]) for r in res} - {None}
        if len(found) != 1:
            return None
        self._agg_used_count = any("count" in r["combo"].values() for r in res)
        return found.pop()

    @staticmethod
    def _agg_divisor(code: str, nm: str) -> bool:
        return re.search(r"/\s*\(?\s*" + re.escape(nm) + r"\b", code) is not None


def _backward_of(s) -> Optional[str]:
    """The name handed to ``backward()`` by *s*: ``loss.backward()``, ``engine.backward(loss)``,
    ``scaler.scale(loss).backward()``; None otherwise."""
    if not isinstance(s, cst.Expr) or not isinstance(s.value, cst.Call):
        return None
    c = s.value
    if not (isinstance(c.func, cst.Attribute) and c.func.attr.value == "backward"):
        return None
    recv = c.func.value
    if isinstance(recv, cst.Name):
        if c.args and isinstance(c.args[0].value, cst.Name) and recv.value not in ("loss",) and \
                not recv.value.endswith("loss"):
            return c.args[0].value.value
        return recv.value
    if isinstance(recv, cst.Call) and recv.args and isinstance(recv.args[0].value, cst.Name):
        return recv.args[0].value.value
    if c.args and isinstance(c.args[0].value, cst.Name):
        return c.args[0].value.value
    return None


def _stmt_targets(s) -> set:
    if isinstance(s, cst.AugAssign):
        return {_code(s.target)}
    if isinstance(s, cst.Assign):
        return {n for t in s.targets for n in _loads(t.target)}
    return set()


def _comp_fors(n) -> list:
    out, f = [], n.for_in
    while f is not None:
        out.append(f)
        f = f.inner_for_in
    return out
