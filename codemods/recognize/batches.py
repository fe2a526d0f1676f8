"""How many prompts one training step draws, and how many steps the data gives, from what the code
does with its data (never from the names it uses):

- the ``DataLoader`` a rollout loop iterates, followed through the helper that builds it
  (``def make_loader(bs): return DataLoader(ds, batch_size=bs)``) and through the parameter it is
  handed in (``train(loader)``), with the helper's arguments bound at that one call site;
- ``next(it)`` drawn N times per step (``for _ in range(N): items.append(next(it))`` or
  ``[next(it) for _ in range(N)]``) in the code that feeds the rollout;
- epochs x batches: ``for epoch in range(E): for batch in loader:`` with the dataset's length known
  statically (a list literal of the program, through ``list(...)``, ``x or DEFAULT`` and a
  ``Dataset`` class whose ``__len__`` is ``len(self.items)``).

Values are bound only through one call site or a parameter default; anything ambiguous is left out.
"""

from __future__ import annotations

import math
from typing import Optional

import libcst as cst

from .._static import FuncInfo, Known, Runtime, walk
from .base import _kwarg, _last

_WRAPPERS = ("enumerate", "tqdm", "iter", "trange", "cycle")
_DATASET_METHODS = ("shuffle", "map", "filter", "select", "with_format", "remove_columns", "rename_column",
                    "train_test_split", "flatten_indices", "sort", "cast_column")


class BatchesMixin:
    # ------------------------------------------------------------------ binding
    def _bind_call(self, call: cst.Call, scope, env: dict, info: FuncInfo, offset: int) -> Optional[dict]:
        """Parameter name -> (expr, scope, env) for *info* called by *call*; None when a star arg hides one."""
        out: dict = {}
        pos = 0
        given: dict = {}
        for a in call.args:
            if a.star:
                return None
            if a.keyword is not None:
                given[a.keyword.value] = a.value
            else:
                given[pos + offset] = a.value
                pos += 1
        for name, (idx, param) in info.params.items():
            if param.star:
                continue
            arg = given.get(name, given.get(idx))
            if arg is not None:
                out[name] = (arg, scope, env)
            elif param.default is not None:
                out[name] = (param.default, info.parent, {})
        return out

    def _resolve_name(self, name: str, scope, env: dict):
        """(expr, scope, env) a name stands for: its one assignment in the scope, the argument bound to
        it, the one call site of the function it is a parameter of, or a global of the program."""
        if scope is not None and name in scope.assigns and ("=", name) not in env:
            exprs = [e for e in scope.assigns[name]]
            if len(exprs) != 1 or exprs[0] is None:
                return None
            return exprs[0], scope, {**env, ("=", name): True}
        if name in env:
            return env[name]
        if scope is not None and name in scope.params:
            idx, param = scope.params[name]
            if param.star:
                return None
            sites = self.p.calls_by_callee().get(scope.qual, [])
            if len(sites) != 1:
                return (param.default, scope.parent, {}) if not sites and param.default is not None else None
            call, caller, offset = sites[0]
            bound = self._bind_call(call, caller, {}, scope, offset)
            return bound.get(name) if bound else None
        if scope is not None and scope.parent is not None:
            return self._resolve_name(name, scope.parent, {})
        exprs = [e for e in self.p.assignments_of(name, scope) if e is not None]
        if len(exprs) != 1:
            return None
        return exprs[0], None, {}

    def _origin(self, expr, scope, env: dict, depth: int = 0):
        """The call that built *expr* (unwrapping ``enumerate`` / ``tqdm`` / ``iter``) and where it runs."""
        for _ in range(10):
            if isinstance(expr, cst.Call) and _last(expr.func) in _WRAPPERS and expr.args:
                expr = expr.args[0].value
                continue
            if isinstance(expr, cst.Call):
                return expr, scope, env
            if isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name) and expr.value.value == "self":
                r = self._resolve_self_attr(expr.attr.value, scope)
                if r is None:
                    return None
                expr, scope, env = r
                continue
            if not isinstance(expr, cst.Name):
                return None
            r = self._resolve_name(expr.value, scope, env)
            if r is None:
                return None
            expr, scope, env = r
        return None

    def _resolve_self_attr(self, attr: str, scope):
        """``self.loader`` in a method: its one assignment in the class, with ``__init__``'s parameters bound
        at the one place the class is built (or to their defaults when it is built nowhere in the program)."""
        cls = self.p.class_of(scope) if scope is not None else None
        if cls is None:
            return None
        stores = self.p.self_assignments(cls, attr)
        if len(stores) != 1 or stores[0][0] is None or stores[0][1] is None:
            return None
        val, fn = stores[0]
        env: dict = {}
        if fn.name == "__init__":
            sites = self.p.calls_by_callee().get(fn.qual, [])
            if len(sites) > 1:
                return None
            if sites:
                env = self._bind_call(sites[0][0], sites[0][1], {}, fn, sites[0][2]) or {}
        return val, fn, env

    def _returned_call(self, call: cst.Call, scope, env: dict):
        """A helper of the program with one ``return CALL``: that call with the helper's parameters bound."""
        t = self.p.resolve_callee(call, scope)
        if t is None or t[0].cls is not None:
            return None
        info, offset = t
        rets = [n for n in walk(info.node.body) if isinstance(n, cst.Return) and self.p.func_of(n) is info]
        if len(rets) != 1 or rets[0].value is None:
            return None
        bound = self._bind_call(call, scope, env, info, offset)
        if bound is None:
            return None
        return self._origin(rets[0].value, info, bound)

    def _ev_in(self, expr, scope, env: dict):
        """Evaluate *expr*; a bare name goes through the bindings first."""
        seen = 0
        while isinstance(expr, cst.Name) and seen < 10:
            r = self._resolve_name(expr.value, scope, env)
            if r is None:
                break
            expr, scope, env = r
            seen += 1
        if isinstance(expr, cst.Name) and expr.value == "None":
            return Known(None, self.p.line(expr))
        return self.p.ev(expr, scope)

    def data_loader(self, expr, scope, env=None):
        """(batch-size Ev, dataset expr, scope, env, drop_last Ev) of the torch DataLoader *expr* is, or None."""
        o = self._origin(expr, scope, env or {})
        for _ in range(4):
            if o is None:
                return None
            call, sc, en = o
            if _last(call.func) == "DataLoader":
                pos = [a.value for a in call.args if a.keyword is None and not a.star]
                bs = _kwarg(call, "batch_size")
                bs = bs if bs is not None else (pos[1] if len(pos) > 1 else None)
                bs_ev = self._ev_in(bs, sc, en) if bs is not None else Known(1, self.p.line(call))
                ds = _kwarg(call, "dataset")
                ds = ds if ds is not None else (pos[0] if pos else None)
                dl = _kwarg(call, "drop_last")
                dl_ev = self._ev_in(dl, sc, en) if dl is not None else Known(False, self.p.line(call))
                if _kwarg(call, "sampler") is not None or _kwarg(call, "batch_sampler") is not None:
                    return None
                return bs_ev, ds, sc, en, dl_ev
            o = self._returned_call(call, sc, en)
        return None

    # ------------------------------------------------------------------ static length of a dataset
    def static_len(self, expr, scope, env: dict, depth: int = 0) -> Optional[int]:
        if expr is None or depth > 12:
            return None
        if isinstance(expr, (cst.List, cst.Tuple, cst.Set)):
            if any(isinstance(e, cst.StarredElement) for e in expr.elements):
                return None
            return len(expr.elements)
        if isinstance(expr, cst.Name):
            r = self._resolve_name(expr.value, scope, env)
            return self.static_len(*r, depth + 1) if r is not None else None
        if isinstance(expr, cst.BooleanOperation) and isinstance(expr.operator, cst.Or):
            left = self._ev_in(expr.left, scope, env)
            if isinstance(left, Known) and left.value is None:
                return self.static_len(expr.right, scope, env, depth + 1)
            n = self.static_len(expr.left, scope, env, depth + 1)
            return n if n else None
        if isinstance(expr, cst.Call):
            if isinstance(expr.func, cst.Name) and expr.func.value in ("list", "tuple") and len(expr.args) == 1:
                return self.static_len(expr.args[0].value, scope, env, depth + 1)
            cls = expr.func.value if isinstance(expr.func, cst.Name) and expr.func.value in self.p.classes else None
            if cls is None:
                o = self._returned_call(expr, scope, env)
                return self.static_len(*o, depth + 1) if o is not None else None
            return self._class_len(cls, expr, scope, env, depth)
        return None

    def _class_len(self, cls: str, call: cst.Call, scope, env: dict, depth: int) -> Optional[int]:
        """``len(C(...))`` for a class of the program whose ``__len__`` returns ``len(self.attr)`` and
        whose ``__init__`` assigns ``self.attr`` once."""
        ln = self.p.funcs_by_qual.get(f"{cls}.__len__")
        init = self.p.funcs_by_qual.get(f"{cls}.__init__")
        if ln is None or init is None:
            return None
        rets = [n for n in walk(ln.node.body) if isinstance(n, cst.Return)]
        if len(rets) != 1 or not (isinstance(rets[0].value, cst.Call) and _last(rets[0].value.func) == "len"
                                  and len(rets[0].value.args) == 1):
            return None
        tgt = rets[0].value.args[0].value
        if not (isinstance(tgt, cst.Attribute) and isinstance(tgt.value, cst.Name) and tgt.value.value == "self"):
            return None
        stores = self.p.self_assignments(cls, tgt.attr.value)
        if len(stores) != 1 or stores[0][1] is not init or stores[0][0] is None:
            return None
        bound = self._bind_call(call, scope, env, init, 1)
        if bound is None:
            return None
        return self.static_len(stores[0][0], init, bound, depth + 1)

    # ------------------------------------------------------------------ what the rollout loop draws
    def rollout_data_loops(self) -> list:
        """The main loop and the loops inside it that generate (and train) in each iteration."""
        loop = self.main_loop
        out = [loop]
        for n in walk(loop.body):
            if isinstance(n, cst.For) and n is not loop:
                tags = self.reach(n)
                if "gen" in tags and ("backward" in tags or "trl_step" in tags) and self._generates_each_time(n):
                    out.append(n)
        return out

    def extract_batches(self) -> None:
        """data.rollout_batch_size from the DataLoader a rollout loop iterates or from ``next()`` draws;
        trainer.total_steps = epochs x batches when the dataset's length is static."""
        c = self.a.config
        scope = self.loop_func
        loops = self.rollout_data_loops()
        found = []
        for lp in loops:
            if isinstance(lp, cst.For):
                dl = self.data_loader(lp.iter, scope)
                if dl is not None:
                    found.append((lp, dl))
        if len(found) == 1 and self._steps_every_batch(found[0][0]):
            lp, (bs, ds, sc, en, drop) = found[0]
            if isinstance(bs, Runtime) and "world size" in bs.why:
                bs = self.global_of_per_rank(lambda: self.data_loader(lp.iter, scope)[0], "the DataLoader batch size") or bs
            if "data.rollout_batch_size" not in c:
                self.emit("data.rollout_batch_size", bs, "the DataLoader batch size")
            if "trainer.total_steps" not in c and lp is not self.main_loop and isinstance(bs, Known) and \
                    isinstance(bs.value, int) and bs.value > 0 and isinstance(drop, Known):
                outer = [a for a in self.p.ancestors(lp) if isinstance(a, (cst.For, cst.While))]
                epochs = self.loop_count(self.main_loop, scope) if outer and outer[0] is self.main_loop else None
                n = self.static_len(ds, sc, en)
                if isinstance(epochs, Known) and isinstance(epochs.value, int) and n:
                    per = n // bs.value if drop.value else math.ceil(n / bs.value)
                    self.a.config["trainer.total_steps"] = epochs.value * per
                    self.a.provenance["trainer.total_steps"] = self.loc(self.p.line(lp))
                    self.a.warnings = [w for w in self.a.warnings if not w.startswith("trainer.total_steps is left out")]
                    self.a.warn(f"trainer.total_steps = {epochs.value * per}: {epochs.value} epochs x {per} batches "
                                f"of {bs.value} from a dataset of {n} prompts ({self.loc(self.p.line(lp))})")
        if "data.rollout_batch_size" not in c:
            k = self.next_draws()
            if isinstance(k, Runtime) and "world size" in k.why:
                k = self.global_of_per_rank(self.next_draws, "the prompts drawn per step") or k
            if k is not None:
                self.emit("data.rollout_batch_size", k, "the prompts drawn per step")

    def _steps_every_batch(self, lp) -> bool:
        """No optimizer step in the loop's reach waits for several of its batches (``if i % k == 0:``):
        then one batch of the loader is one training step."""
        from .base import _find_modulo

        for call, _ in self.optimizer_steps(lp):
            for anc in self.p.ancestors(call):
                if anc is lp:
                    break
                if isinstance(anc, cst.If) and _find_modulo(anc.test) is not None:
                    return False
        return True

    def next_draws(self):
        """N of ``for _ in range(N): x = next(it)`` / ``[next(it) for _ in range(N)]`` in the code that
        feeds the rollout once per step (a function the main loop calls, or its own body)."""
        loop = self.main_loop
        regions = [(loop.body, self.loop_func)]
        for n in walk(loop.body):
            if isinstance(n, cst.Call):
                t = self.p.resolve_callee(n, self.p.func_of(n))
                if t is not None and "gen" in self.reach(t[0].node) and self._generates_each_time_call(n, loop):
                    regions.append((t[0].node.body, t[0]))
        hits = []
        for body, sc in regions:
            for n in walk(body):
                if not (isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value == "next"):
                    continue
                holder = None
                for anc in self.p.ancestors(n):
                    if anc is loop:
                        break
                    if isinstance(anc, (cst.ListComp, cst.GeneratorExp)) and anc.for_in.inner_for_in is None:
                        anc = anc.for_in  # [next(it) for _ in range(N)]
                    if isinstance(anc, (cst.For, cst.CompFor)) and isinstance(anc.iter, cst.Call) and \
                            _last(anc.iter.func) == "range" and len(anc.iter.args) == 1:
                        holder = anc if holder is None else "nested"
                    elif isinstance(anc, (cst.While, cst.If)):
                        holder = "nested"
                    elif isinstance(anc, cst.FunctionDef):
                        break
                if holder is not None and holder != "nested":
                    hits.append((holder, self.p.func_of(n) or sc, n))
        if len(hits) != 1:
            return None
        holder, sc, drawn = hits[0]
        if isinstance(holder, cst.For) and ({"gen", "backward"} & self.reach(holder)):
            return None  # a loop that also generates or trains is no draw of prompts
        n = self.p.ev(holder.iter.args[0].value, sc)
        src = drawn.args[0].value if drawn.args else None
        dl = self.data_loader(src, sc) if src is not None else None
        if dl is not None:  # next(iter(loader)) draws a batch: N batches of bs prompts
            bs = dl[0]
            if isinstance(n, Known) and isinstance(bs, Known) and isinstance(bs.value, int):
                return Known(n.value * bs.value, n.line)
            return None
        # one item per draw only from a source of rows (a dataset, a list); an unknown iterator may yield batches
        return n if src is not None and self._row_source(src, sc) else None

    def _row_source(self, expr, scope) -> bool:
        """*expr* iterates single rows: a list / tuple / comprehension of the program, or a Hugging Face
        dataset (``load_dataset(...)``, its split, ``.shuffle/.map/.filter/.select(...)``), through
        ``iter`` / ``cycle``, names and ``self.`` attributes."""
        env: dict = {}
        for _ in range(12):
            if isinstance(expr, (cst.List, cst.Tuple, cst.ListComp)):
                return True
            if isinstance(expr, cst.Call) and _last(expr.func) in ("iter", "cycle") and expr.args:
                expr = expr.args[0].value
                continue
            if isinstance(expr, cst.Call) and _last(expr.func) in ("load_dataset", "list"):
                return True
            if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and \
                    expr.func.attr.value in _DATASET_METHODS:
                return True  # the datasets API (dataset.shuffle(seed=...), .map(...)): iterated row by row
            if isinstance(expr, cst.Subscript) and isinstance(expr.value, cst.Call) and \
                    _last(expr.value.func) == "load_dataset":
                return True
            if isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name) and expr.value.value == "self":
                r = self._resolve_self_attr(expr.attr.value, scope)
            elif isinstance(expr, cst.Name):
                r = self._resolve_name(expr.value, scope, env)
            elif isinstance(expr, cst.Call):
                r = self._returned_call(expr, scope, env)  # a helper returning the dataset
            else:
                return False
            if r is None:
                return False
            expr, scope, env = r
        return False

    def _generates_each_time_call(self, call, loop) -> bool:
        for anc in self.p.ancestors(call):
            if anc is loop:
                return True
            if isinstance(anc, (cst.If, cst.For, cst.While)):
                return False
        return False

    # ------------------------------------------------------------------ blocks of rows a loop iterates
    def chunk_rows(self, it, scope):
        """m when a loop iterates blocks of m samples: ``x.reshape(A, m, *x.shape[1:])`` /
        ``x.view(A, m, x.size(1))`` (the sample dimension split into A blocks of m, the rest kept), directly,
        through one assignment, or as the first sequence of ``zip(...)``; None otherwise."""
        if isinstance(it, cst.Call) and _last(it.func) == "zip" and it.args:
            it = it.args[0].value
        it = _keep_shape(it)
        if isinstance(it, cst.Name):
            # ``x = x.cpu()`` / ``x = x.to(device)`` keep the shape: the one other assignment decides
            exprs = [_keep_shape(e) for e in self.p.assignments_of(it.value, scope) if e is not None]
            exprs = [e for e in exprs if not (isinstance(e, cst.Name) and e.value == it.value)]
            if len(exprs) != 1:
                return None
            it = exprs[0]
        if not (isinstance(it, cst.Call) and isinstance(it.func, cst.Attribute) and
                it.func.attr.value in ("reshape", "view")):
            return None
        args = [a for a in it.args if a.keyword is None]
        if len(args) == 1 and isinstance(args[0].value, (cst.Tuple, cst.List)):
            args = [cst.Arg(value=e.value, star="*" if isinstance(e, cst.StarredElement) else "")
                    for e in args[0].value.elements]
        if len(args) < 3 or any(a.star for a in args[:2]):
            return None
        for a in args[2:]:
            v = a.value
            if isinstance(v, cst.Name) and not a.star:  # width = ids.shape[1]
                exprs = [e for e in self.p.assignments_of(v.value, scope) if e is not None]
                v = exprs[0] if len(exprs) == 1 else v
            code = cst.Module(body=[]).code_for_node(v)
            if a.star:
                if not (code.endswith(".shape[1:]") or code.endswith(".size()[1:]")):
                    return None
            elif not (code.endswith(".shape[1]") or code.endswith(".size(1)")):
                # (not -1: x.view(B, T, -1) may merge rows of tokens, which are no samples)
                return None
        return args[1].value


_SHAPE_KEEPING = ("cpu", "cuda", "to", "detach", "contiguous", "float", "half", "bfloat16", "clone")


def _keep_shape(e):
    """``x.reshape(...).cpu().to(dev)`` -> ``x.reshape(...)``: device / dtype moves keep the shape."""
    while isinstance(e, cst.Call) and isinstance(e.func, cst.Attribute) and e.func.attr.value in _SHAPE_KEEPING:
        e = e.func.value
    return e


def _programs(p) -> list:
    return [p] + list(getattr(p, "local_modules", {}).values())


class PerRankMixin:
    def global_of_per_rank(self, compute, what: str):
        """A per-rank share of a global count (``64 // world_size // G`` prompts per rank): *compute* run
        with the world size 1, 2, 4 and 8 gives n / W each time, so the whole step draws n (the value at
        W = 1); None when it does not scale so (the world size multiplies it, or anything else is unknown)."""
        vals = {}
        progs = _programs(self.p)
        for w in (1, 2, 4, 8):
            for q in progs:
                q.assume_world_size = w
            try:
                v = compute()
            finally:
                for q in progs:
                    q.assume_world_size = None
            if not (isinstance(v, Known) and isinstance(v.value, int) and not isinstance(v.value, bool) and v.value > 0):
                return None
            vals[w] = v
        n = vals[1].value
        if any(v.value * w != n for w, v in vals.items()):
            return None
        self.a.warn(f"{what} at {self.loc(vals[1].line)} is a per-rank share of {n} (it is {n} / world size "
                    f"on each rank for 1, 2, 4 and 8 ranks): the whole step uses {n}")
        return vals[1]


class GroupBufferMixin:
    """A step that fills a container with N groups (``while not buf.full(): buf.push(group)`` or
    ``while len(groups) < N: groups.append(group)``) samples N prompts x G responses; draining it k groups
    per optimizer step (``[buf.pop() for _ in range(k)]``) makes minibatches of k x G samples. A group
    skipped before it is stored (``if <condition>: continue``) is dynamic sampling, which is warned."""

    def extract_group_buffer(self) -> None:
        c = self.a.config
        g = c.get("algorithm.group_size")
        if not isinstance(g, int) or isinstance(g, bool) or c.get("algorithm.name") not in ("grpo", "rloo"):
            return
        loop, scope = self.main_loop, self.loop_func
        fills = []
        for w in walk(loop.body):
            if isinstance(w, cst.While) and w is not loop and "gen" in self.reach(w):
                r = self._fill_target(w, scope)
                if r is not None:
                    fills.append((w, *r))
        if len(fills) != 1:
            return
        w, buf, cap = fills[0]
        pushes = [n for n in walk(w.body) if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and
                  n.func.attr.value in ("push", "append", "add", "put") and _code_of(n.func.value) == buf and n.args]
        if len(pushes) != 1 or not self._is_group(pushes[0].args[0].value, scope, g):
            return
        skips = [n for n in walk(w.body) if isinstance(n, cst.Continue)]
        if skips:
            self.a.warn(f"{self.loc(self.p.line(skips[0]))}: groups are rejected and sampled again before they are "
                        "stored (dynamic sampling, e.g. groups whose rewards are all equal); MegatronTrainer keeps "
                        "every group it samples: this filter is dropped")
        if "data.rollout_batch_size" not in c and isinstance(cap, Known):
            self.emit("data.rollout_batch_size", cap, "the groups collected per step")
            self.a.warn(f"data.rollout_batch_size = {cap.value}: the loop at {self.loc(self.p.line(w))} collects "
                        f"{cap.value} groups of {g} responses per step")
        if "algorithm.mini_batch_size" in c:
            return
        for d in walk(loop.body):
            if not (isinstance(d, cst.While) and d is not w and "backward" in self.reach(d)):
                continue
            pops = [n for n in walk(d.body) if isinstance(n, (cst.ListComp, cst.GeneratorExp)) and
                    isinstance(n.elt, cst.Call) and isinstance(n.elt.func, cst.Attribute) and
                    n.elt.func.attr.value in ("pop", "popleft", "get") and _code_of(n.elt.func.value) == buf and
                    n.for_in.inner_for_in is None and isinstance(n.for_in.iter, cst.Call) and
                    _last(n.for_in.iter.func) == "range" and len(n.for_in.iter.args) == 1]
            steps = [s for s, _ in self.optimizer_steps(loop) if any(x is d for x in self.p.ancestors(s))]
            if len(pops) == 1 and len(steps) == 1 and \
                    not any(isinstance(x, (cst.If, cst.For, cst.While)) and x is not d
                            for x in self._between(steps[0], d)):
                k = self.p.ev(pops[0].for_in.iter.args[0].value, scope)
                if isinstance(k, Known) and isinstance(k.value, int) and not isinstance(k.value, bool):
                    self.emit("algorithm.mini_batch_size", Known(k.value * g, k.line), "the samples per step")
                    self.a.warn(f"algorithm.mini_batch_size = {k.value * g}: each optimizer step "
                                f"({self.loc(self.p.line(steps[0]))}) takes {k.value} groups of {g} responses")
            return

    def _between(self, node, top):
        out = []
        for anc in self.p.ancestors(node):
            if anc is top:
                break
            out.append(anc)
        return out

    def _fill_target(self, w, scope):
        """(container code, capacity Ev) of ``while not buf.full():`` / ``while len(buf) < N:``."""
        t = w.test
        if isinstance(t, cst.UnaryOperation) and isinstance(t.operator, cst.Not) and isinstance(t.expression, cst.Call):
            call = t.expression
            if not (isinstance(call.func, cst.Attribute) and not call.args):
                return None
            recv = call.func.value
            cls = self.p.instance_class(recv, scope)
            info = self.p.funcs_by_qual.get(f"{cls}.{call.func.attr.value}") if cls else None
            if info is None:
                return None
            rets = [n for n in walk(info.node.body) if isinstance(n, cst.Return)]
            if len(rets) != 1 or not isinstance(rets[0].value, cst.Comparison) or \
                    len(rets[0].value.comparisons) != 1 or \
                    not isinstance(rets[0].value.comparisons[0].operator, (cst.Equal, cst.GreaterThanEqual)):
                return None
            left, right = rets[0].value.left, rets[0].value.comparisons[0].comparator
            if not (isinstance(left, cst.Call) and _last(left.func) == "len"):
                return None
            if isinstance(right, cst.Attribute) and isinstance(right.value, cst.Name) and right.value.value == "self":
                stores = self.p.self_assignments(cls, right.attr.value)
                init = self.p.funcs_by_qual.get(f"{cls}.__init__")
                ctor = [e for e in self.p.assignments_of(recv.value, scope) if e is not None] \
                    if isinstance(recv, cst.Name) else []
                if len(stores) != 1 or init is None or stores[0][1] is not init or len(ctor) != 1 or \
                        not isinstance(ctor[0], cst.Call):
                    return None
                bound = self._bind_call(ctor[0], scope, {}, init, 1)
                cap = self._ev_in(stores[0][0], init, bound or {})
            else:
                cap = self.p.ev(right, info)
            return _code_of(recv), cap
        if isinstance(t, cst.Comparison) and len(t.comparisons) == 1 and \
                isinstance(t.comparisons[0].operator, cst.LessThan) and isinstance(t.left, cst.Call) and \
                _last(t.left.func) == "len" and len(t.left.args) == 1:
            return _code_of(t.left.args[0].value), self.p.ev(t.comparisons[0].comparator, scope)
        return None

    def _is_group(self, value, scope, g) -> bool:
        """*value* holds G responses of one prompt: ``[rollout(...) for _ in range(G)]`` (directly or
        through its one assignment)."""
        if isinstance(value, cst.Name):
            exprs = [e for e in self.p.assignments_of(value.value, scope) if e is not None]
            if len(exprs) != 1:
                return False
            value = exprs[0]
        if not (isinstance(value, cst.ListComp) and value.for_in.inner_for_in is None and
                isinstance(value.for_in.iter, cst.Call) and _last(value.for_in.iter.func) == "range" and
                len(value.for_in.iter.args) == 1):
            return False
        n = self.p.ev(value.for_in.iter.args[0].value, scope)
        gen = isinstance(value.elt, cst.Call) and (
            "gen" in self.call_tags(value.elt) or
            (lambda t: t is not None and "gen" in self.reach(t[0].node))(self.p.resolve_callee(value.elt, scope)))
        return isinstance(n, Known) and n.value == g and gen


def _code_of(node) -> str:
    return cst.Module(body=[]).code_for_node(node)
