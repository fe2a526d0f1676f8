"""Loop discovery: which loop is the training loop, which function runs it, its shape."""

from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from .._static import FuncInfo, Known, Record, Runtime, dotted, walk
from .base import (ENTROPY_RE, GEN_RE, LOSS_RE, OLD_NAME_RE, OPTIMIZERS, REF_NAME_RE, REWARD_RE, SCHEDULER_RE,
                   VALUE_LOSS_RE, _MISSING, _call_arg, _code, _factors, _find_modulo, _is_one, _kwarg, _last,
                   _names_in)

# a call that restores a saved run: the branch around it resumes (its start value is not the fresh run's)
RESUME_RE = re.compile(r"load_checkpoint|load_state_dict|resume\w*|restore\w*|from_checkpoint", re.I)


class LoopsMixin:
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

    def find_main_loop(self):
        loop = self._find_main_loop(self.loops)
        if loop is None and getattr(self, "module_loops", None):
            # a loop in a method of a local module's class, reached from this script's top level
            loop = self._find_main_loop(self.module_loops)
            if loop is not None:
                func = self.p.func_of(loop)
                if func is None or not any(self._stmt_reaches(st, {func.node}) for st in self.p.module.body
                                           if not isinstance(st, (cst.FunctionDef, cst.ClassDef))) and \
                        not any(self._stmt_reaches(st, {func.node}) for st in self.p.module.body
                                if isinstance(st, cst.FunctionDef)):
                    return None
        return loop

    def _find_main_loop(self, loops):
        cands = []
        for loop in loops:
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

    # ------------------------------------------------------------------ loop shape
    def extract_loop_shape(self) -> None:
        a = self.a
        loop = self.main_loop
        scope = self.loop_func
        inner_data_loop = False
        for n in walk(loop.body):
            if isinstance(n, (cst.For, cst.While)) and n is not loop:
                tags = self.reach(n)
                if "gen" in tags and ("backward" in tags or "trl_step" in tags) and self._generates_each_time(n):
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
        if path is None or getattr(self, "on_policy", None):
            # on-policy PG: loops around backward() accumulate gradients of one step (policy_gradient.py);
            # a strided loop among them slices the batch into micro-batches
            strided = [(node, sc) for kind, node, sc in (path or []) if kind in ("range3", "split")]
            if getattr(self, "on_policy", None) and len(strided) == 1 and \
                    not self._steps_every_iteration(strided[0][0]):
                self.emit("algorithm.micro_batch_size", self.p.ev(*strided[0]), "the micro-batch size")
            return
        epochs_set = False
        mini_seen = False
        for kind, node, sc in path:
            if kind == "range1" and not epochs_set:
                self.emit("algorithm.ppo_epochs", self.p.ev(node, sc), "the number of PPO epochs")
                epochs_set = True
            elif kind in ("range3", "split") and not mini_seen and not self._steps_every_iteration(node):
                # backward() in every iteration but the optimizer steps only under a condition
                # (`if n % k == 0: optimizer.step()`) or after the loop: gradient accumulation over
                # micro-batches; the minibatch is several of them (left out unless proven)
                self.emit("algorithm.micro_batch_size", self.p.ev(node, sc), "the micro-batch size")
                mini_seen = True
                gated = self.gated_step(self.__dict__.get("range_loops", {}).get(id(node)), node, sc)  # values.py
                if isinstance(gated, Known):  # `if samples_seen % k == 0: optimizer.step()`: k samples per step
                    self.emit("algorithm.mini_batch_size", gated, "the samples per optimizer step")
                else:
                    self.a.warn(f"{self.loc(self.p.line(node))}: the optimizer does not step in every iteration of "
                                "this loop (gradient accumulation): its stride is the micro-batch size; "
                                "algorithm.mini_batch_size is left out")
            elif kind in ("range3", "split") and not mini_seen:
                stop = self.__dict__.get("range_stops", {}).get(id(node))
                gated = self.gated_step(self.__dict__.get("range_loops", {}).get(id(node)), node, sc)  # values.py
                if gated is not None:
                    # the optimizer steps every N samples inside this loop: it slices micro-batches
                    self.emit("algorithm.micro_batch_size", self.p.ev(node, sc), "the micro-batch size")
                    self.emit("algorithm.mini_batch_size", gated, "the samples per optimizer step")
                elif stop is not None and self.whole_batch_step(stop, node, sc):  # values.py
                    self.emit("algorithm.mini_batch_size", Known(None, self.p.line(node)), "the minibatch size")
                else:
                    self.emit("algorithm.mini_batch_size", self.p.ev(node, sc), "the minibatch size")
                    if self._no_inner_loop(node):
                        # one backward() per optimizer step over the whole minibatch: no accumulation
                        self.emit("algorithm.micro_batch_size", self.p.ev(node, sc), "the micro-batch size")
                mini_seen = True
            elif kind in ("range3", "split"):
                # a strided loop inside the minibatch loop slices it into micro-batches (gradient
                # accumulation): its step is the micro-batch size, never the minibatch size
                self.emit("algorithm.micro_batch_size", self.p.ev(node, sc), "the micro-batch size")
        if not epochs_set:
            self.emit("algorithm.ppo_epochs", Known(1, self.p.line(loop)))

    def _generates_each_time(self, loop) -> bool:
        """Whether the loop generates outside a periodic branch: generation only under
        ``if n % k == 0:`` (an evaluation every k samples) does not make it a rollout data loop."""
        for n in walk(loop.body):
            if not isinstance(n, cst.Call):
                continue
            t = self.p.resolve_callee(n, self.p.func_of(n))
            if "gen" not in self.call_tags(n) and not (t is not None and "gen" in self.reach(t[0].node)):
                continue
            periodic = False
            for anc in self.p.ancestors(n):
                if anc is loop:
                    break
                if isinstance(anc, cst.If) and _find_modulo(anc.test) is not None:
                    periodic = True
            if not periodic:
                return True
        return False

    def _steps_every_iteration(self, count_node) -> bool:
        """Whether an optimizer ``.step()`` runs unconditionally in each iteration of the loop whose
        count is *count_node* (directly or through a function it calls)."""
        loop = self.__dict__.get("count_loops", {}).get(id(count_node)) or \
            next((a for a in self.p.ancestors(count_node) if isinstance(a, cst.For)), None)
        if loop is None or not hasattr(self, "optimizer_steps"):
            return True
        for call, region in self.optimizer_steps(self.main_loop):
            anchor = call
            if not any(x is loop for x in self.p.ancestors(call)):
                # a step in a function called from the loop: look at the call site instead
                f = self.p.func_of(call)
                sites = [c for c, _, _ in self.p.calls_by_callee().get(f.qual, [])] if f is not None else []
                sites = [c for c in sites if any(x is loop for x in self.p.ancestors(c))]
                if not sites:
                    continue
                anchor = sites[0]
            guarded = False
            for anc in self.p.ancestors(anchor):
                if anc is loop:
                    break
                if isinstance(anc, cst.If):
                    guarded = True
            if not guarded:
                return True
        return False

    def step_cap(self, loop, scope):
        """``for step, batch in enumerate(loader): if step >= n: break`` as the loop's first statement:
        at most n steps (``>``: n + 1). None when there is no such cap."""
        if not (isinstance(loop, cst.For) and isinstance(loop.iter, cst.Call)):
            return None
        it = loop.iter
        if _last(it.func) in ("tqdm",) and it.args and isinstance(it.args[0].value, cst.Call):
            it = it.args[0].value
        if _last(it.func) != "enumerate" or len(it.args) != 1 or not isinstance(loop.target, cst.Tuple) or \
                not isinstance(loop.target.elements[0].value, cst.Name):
            return None
        counter = loop.target.elements[0].value.value
        body = loop.body.body if isinstance(loop.body, cst.IndentedBlock) else []
        if not body or not isinstance(body[0], cst.If) or body[0].orelse is not None:
            return None
        test, inner = body[0].test, body[0].body.body
        if not (len(inner) == 1 and isinstance(inner[0], cst.SimpleStatementLine)
                and isinstance(inner[0].body[0], cst.Break)):
            return None
        if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and isinstance(test.left, cst.Name)
                and test.left.value == counter):
            return None
        op = test.comparisons[0].operator
        n = self.p.ev(test.comparisons[0].comparator, scope)
        if not (isinstance(n, Known) and isinstance(n.value, int) and not isinstance(n.value, bool)):
            return n if isinstance(n, Runtime) else None
        if isinstance(op, cst.GreaterThanEqual):
            return n
        if isinstance(op, cst.GreaterThan):
            return Known(n.value + 1, n.line)
        return None

    def loop_count(self, loop, scope):
        if isinstance(loop, cst.For):
            it = loop.iter
            if isinstance(it, cst.Call) and (_last(it.func) == "range" or _last(it.func) == "trange" and
                                             len([x for x in it.args if x.keyword is None]) == 2):
                args = [x.value for x in it.args if x.keyword is None]
                if len(args) == 1:
                    return self.p.ev(args[0], scope)
                if len(args) == 2:
                    lo, hi = self.p.ev(args[0], scope), self.p.ev(args[1], scope)
                    if not isinstance(lo, Known):
                        lo = self.fresh_start(args[0], scope) or lo
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

    def fresh_start(self, node, scope):
        """``start = 0`` then ``if <checkpoint found>: load_checkpoint(...); start = n + 1``: a fresh run starts
        at the first value (warned: a resumed run starts later); None otherwise."""
        if not isinstance(node, cst.Name) or scope is None or node.value not in scope.assigns:
            return None
        fresh, resumed = [], 0
        for st in walk(scope.node.body):
            if not (isinstance(st, cst.Assign) and len(st.targets) == 1 and isinstance(st.targets[0].target, cst.Name)
                    and st.targets[0].target.value == node.value):
                continue
            branch = next((x for x in self.p.ancestors(st) if isinstance(x, (cst.If, cst.For, cst.While))), None)
            if branch is None and isinstance(st.value, cst.Integer):
                fresh.append(Known(int(st.value.value), self.p.line(st)))
            elif isinstance(branch, cst.If) and any(
                    isinstance(c, cst.Call) and RESUME_RE.search(_last(c.func) or "") for c in walk(branch.body)):
                resumed += 1
            else:
                return None
        if len(fresh) != 1 or not resumed:
            return None
        self.a.warn(f"trainer.total_steps counts a fresh run from {node.value} = {fresh[0].value} "
                    f"({self.loc(fresh[0].line)}); a run resumed from a checkpoint starts later")
        return fresh[0]

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

    def _generator_stride(self, call, scope):
        """The argument a call passes for the stride of a local generator's ``for i in range(0, n, k):
        ... yield ...`` (k one of its parameters), or None."""
        t = self.p.resolve_callee(call, scope)
        if t is None:
            return None
        info, offset = t
        for n in walk(info.node.body):
            if isinstance(n, cst.For) and isinstance(n.iter, cst.Call) and _last(n.iter.func) == "range" and \
                    len(n.iter.args) == 3 and any(isinstance(y, (cst.Yield,)) for y in walk(n.body)):
                k = n.iter.args[2].value
                if isinstance(k, cst.Name) and k.value in info.params:
                    arg = self.p._arg_for(call, info.params[k.value][0], k.value, offset)
                    return arg if arg is not None and arg != "star" else None
        return None

    def _no_inner_loop(self, count_node) -> bool:
        """The mini-batch loop counted by *count_node* reaches backward() without another loop in between
        (in its body or in the functions it calls): each backward() sees the whole mini-batch."""
        loop = self.__dict__.get("path_loops", {}).get(id(count_node))
        if loop is None:
            return False
        for n in walk(loop.body):
            if isinstance(n, (cst.For, cst.While)) and "backward" in self.reach(n):
                return False
            if isinstance(n, cst.Call) and "backward" not in self.call_tags(n):
                t = self.p.resolve_callee(n, self.p.func_of(n))
                if t is not None and "backward" in self.reach(t[0].node) and any(
                        isinstance(x, (cst.For, cst.While)) and "backward" in self.reach(x) for x in walk(t[0].node.body)):
                    return False
        return True

    def _named_loader_bs(self, name, loop, scope):
        """The batch_size node of the ``DataLoader(...)`` a loop variable was bound to (one binding), when
        the loop trains on what it draws (a loop that generates draws prompts: not a mini-batch loop)."""
        if "gen" in self.reach(loop):
            return None
        exprs = [e for e in self.p.assignments_of(name.value, scope) if e is not None]
        if len(exprs) == 1 and isinstance(exprs[0], cst.Call) and _last(exprs[0].func) == "DataLoader" and \
                _kwarg(exprs[0], "sampler") is None and _kwarg(exprs[0], "batch_sampler") is None:
            return _kwarg(exprs[0], "batch_size")
        return None

    def _loops_between(self, body, node, scope):
        out = []
        for anc in self.p.ancestors(node):
            if anc is body:
                break
            if isinstance(anc, cst.For):
                n_before = len(out)
                it = anc.iter
                if isinstance(it, cst.Call) and _last(it.func) == "enumerate" and it.args:
                    it = it.args[0].value
                if isinstance(it, cst.Call) and _last(it.func) == "range":
                    args = [x.value for x in it.args]
                    if len(args) == 1:
                        out.append(("range1", args[0], scope))
                    elif len(args) == 3:
                        out.append(("range3", args[2], scope))
                        self.__dict__.setdefault("range_stops", {})[id(args[2])] = args[1]
                        self.__dict__.setdefault("range_loops", {})[id(args[2])] = anc
                elif isinstance(it, cst.Call) and _last(it.func) in ("split", "chunk") and it.args:
                    if _last(it.func) == "split":
                        out.append(("split", it.args[0].value, scope))
                elif isinstance(it, cst.Call) and _last(it.func) in ("DataLoader",):
                    bs = _kwarg(it, "batch_size")
                    if bs is not None:
                        out.append(("split", bs, scope))
                elif isinstance(it, cst.Call) and (stride := self._generator_stride(it, scope)) is not None:
                    # for mb in make_microbatches(data, micro_size): a local generator slicing by a stride
                    out.append(("split", stride, scope))
                elif isinstance(it, cst.Name) and (bs := self._named_loader_bs(it, anc, scope)) is not None:
                    # sampler = DataLoader(buffer, batch_size=b, ...); for batch in sampler: ...
                    out.append(("split", bs, scope))
                else:
                    m = self.chunk_rows(it, scope)  # batches.py: blocks of m rows of x.reshape(A, m, ...)
                    if m is not None:
                        out.append(("split", m, scope))
                        self.__dict__.setdefault("count_loops", {})[id(m)] = anc  # m may sit outside the loop
                if len(out) > n_before:
                    self.__dict__.setdefault("path_loops", {})[id(out[-1][1])] = anc
        out.reverse()
        return out


    # ------------------------------------------------------------------ entry point
    def main_guard(self) -> Optional[cst.If]:
        for stmt in self.p.module.body:
            if isinstance(stmt, cst.If) and "__main__" in _code(stmt.test) and "__name__" in _code(stmt.test):
                return stmt
        return None

    def find_entry_point(self) -> None:
        """Where the rewrite goes: a function whose body becomes the trainer call, or a block of
        top-level statements (the module body or the ``if __name__ == "__main__":`` body)."""
        a = self.a
        loop, func = self.main_loop, self.loop_func
        if func is not None:
            entry = self.find_entry(func)
            if entry is not None:
                a.entry = entry
                self._drop_unused_loop_def(entry)
                return
        guard = self.main_guard()
        top = loop
        for anc in self.p.ancestors(loop):
            if isinstance(anc, cst.Module):
                break
            top = anc
        if func is None:
            if top is guard:
                body = list(guard.body.body)
                stmt = next(s for s in body if s is loop or any(x is s for x in self.p.ancestors(loop)))
                self._plan_block("main", body, body.index(stmt))
            else:
                body = list(self.p.module.body)
                self._plan_block("module", body, body.index(top))
            return
        targets = {func.node}
        cur = func
        while cur.parent is not None:
            cur = cur.parent
            targets.add(cur.node)
        for kind, body in (("main", list(guard.body.body) if guard is not None else []), ("module", list(self.p.module.body))):
            for i, stmt in enumerate(body):
                if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) or stmt is guard:
                    continue
                if self._stmt_reaches(stmt, targets):
                    self._plan_block(kind, body, i)
                    return
        a.refuse(f"{self.loc(self.p.line(func.node))}: cannot tell which code runs the training loop in "
                 f"{func.qual}() (no call to it from `if __name__ == \"__main__\":` or from a function that block "
                 "calls); call it from main() under `if __name__ == \"__main__\":` and run migrate again")

    def _drop_unused_loop_def(self, entry) -> None:
        """The top-level definition holding the loop (``def fit(...)`` that ``main()`` calls) goes with
        the rewrite of *entry* when nothing else uses it: a migrated file keeps no second training loop."""
        module_body = list(self.p.module.body)
        loop_def = None
        for anc in self.p.ancestors(self.main_loop):
            if isinstance(anc, (cst.FunctionDef, cst.ClassDef)) and any(anc is st for st in module_body):
                loop_def = anc
        if loop_def is None or loop_def is entry.node:
            return
        others = set()
        for stmt in module_body:
            if stmt is not loop_def and stmt is not entry.node:
                others |= _loads(stmt)
        if loop_def.name.value not in others:
            self.a.removed_defs = [next(i for i, st in enumerate(module_body) if st is loop_def)]

    def _stmt_reaches(self, stmt, targets) -> bool:
        for n in walk(stmt):
            if isinstance(n, cst.Call):
                t = self.p.resolve_callee(n, self.p.func_of(n))
                if t is not None and t[0].node in targets:
                    return True
        return any(f.node in targets for f in self.callees_closure(stmt))

    def _plan_block(self, kind: str, body: list, index: int) -> None:
        """Keep definitions, imports, constants and every statement a kept definition needs; the
        statement running the loop becomes the trainer call; the rest of the hand-written setup goes."""
        a = self.a
        module_body = list(self.p.module.body)
        always = []
        cands = []
        for i, stmt in enumerate(body):
            if i == index:
                continue
            if _always_kept(stmt, i):
                always.append(stmt)
            else:
                cands.append(i)
        needed: set = set()
        for stmt in module_body:
            if kind == "main" and isinstance(stmt, cst.If) and stmt is self.main_guard():
                continue
            if kind == "module" and stmt in body and not _always_kept(stmt, module_body.index(stmt)):
                continue
            needed |= _loads(stmt)
        for stmt in always:
            needed |= _loads(stmt)
        kept = set()
        changed = True
        while changed:
            changed = False
            for i in cands:
                if i not in kept and _binds(body[i]) & needed:
                    kept.add(i)
                    needed |= _loads(body[i])
                    changed = True
        removed = [i for i in cands if i not in kept]
        # the definition holding the loop (a trainer class, a train() function) goes too when nothing
        # that stays uses it: a migrated file keeps no second training loop
        loop_def = None
        for anc in self.p.ancestors(self.main_loop):
            if isinstance(anc, (cst.FunctionDef, cst.ClassDef)) and anc in module_body:
                loop_def = anc
        if loop_def is not None:
            others = set()
            for i, stmt in enumerate(module_body):
                if stmt is loop_def or (kind == "module" and (i == index or i in removed)):
                    continue
                if kind == "main" and stmt is self.main_guard():
                    for j, inner in enumerate(body):
                        if j != index and j not in removed:
                            others |= _loads(inner)
                    continue
                others |= _loads(stmt)
            if loop_def.name.value not in others:
                a.removed_defs = [module_body.index(loop_def)]
        for i in removed:
            if i > index:
                a.warn(f"{self.loc(self.p.line(body[i]))}: `{_code(body[i]).splitlines()[0][:60]}` after the loop is "
                       "removed with it; MegatronTrainer saves checkpoints to trainer.output_dir")
        a.block = (kind, index, sorted(removed))


def _always_kept(stmt, index: int) -> bool:
    if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
        return True
    if isinstance(stmt, cst.If) and "__main__" in _code(stmt.test):
        return True
    if isinstance(stmt, cst.SimpleStatementLine):
        for small in stmt.body:
            if isinstance(small, (cst.Import, cst.ImportFrom)):
                continue
            if isinstance(small, cst.Expr) and isinstance(small.value, (cst.SimpleString, cst.ConcatenatedString)):
                continue
            if isinstance(small, (cst.Assign, cst.AnnAssign)) and small.value is not None and _is_literal(small.value):
                continue
            return False
        return True
    return False


def _is_literal(node) -> bool:
    if isinstance(node, (cst.Integer, cst.Float, cst.SimpleString, cst.ConcatenatedString)):
        return True
    if isinstance(node, cst.Name):
        return node.value in ("True", "False", "None")
    if isinstance(node, cst.UnaryOperation):
        return _is_literal(node.expression)
    if isinstance(node, (cst.Tuple, cst.List)):
        return all(_is_literal(e.value) for e in node.elements)
    if isinstance(node, cst.Dict):
        return all(isinstance(e, cst.DictElement) and _is_literal(e.key) and _is_literal(e.value) for e in node.elements)
    return False


def _loads(stmt) -> set:
    # an import reads no variable of the file (`from learner import X` does not need a variable `learner`)
    skip = {id(x) for n in walk(stmt) if isinstance(n, (cst.Import, cst.ImportFrom)) for x in walk(n)}
    return {n.value for n in walk(stmt) if isinstance(n, cst.Name) and id(n) not in skip}


def _binds(stmt) -> set:
    out = set()
    for n in walk(stmt):
        if isinstance(n, cst.AssignTarget):
            out |= {x.value for x in walk(n.target) if isinstance(x, cst.Name)}
        elif isinstance(n, (cst.AnnAssign, cst.AugAssign)):
            out |= {x.value for x in walk(n.target) if isinstance(x, cst.Name)}
        elif isinstance(n, (cst.For, cst.CompFor)):
            out |= {x.value for x in walk(n.target) if isinstance(x, cst.Name)}
        elif isinstance(n, cst.AsName):
            out |= {x.value for x in walk(n.name) if isinstance(x, cst.Name)}
        elif isinstance(n, (cst.FunctionDef, cst.ClassDef)):
            out.add(n.name.value)
    return out
