"""The reward: a top-level function the loop calls, or a TODO when it is built inline."""

from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from .._static import FuncInfo, Known, Record, Runtime, dotted, walk
from .base import (ENTROPY_RE, GEN_RE, LOSS_RE, OLD_NAME_RE, OPTIMIZERS, REF_NAME_RE, REWARD_RE, SCHEDULER_RE,
                   VALUE_LOSS_RE, _MISSING, _call_arg, _code, _factors, _find_modulo, _is_one, _kwarg, _last,
                   _names_in)


class RewardMixin:
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
        # structurally: the top-level function whose results become the group-normalised rewards
        if not top_level and getattr(self, "reward_exprs", None):
            for expr, sc in self.reward_exprs:
                for n in walk(expr):
                    if isinstance(n, cst.Call):
                        target = self.p.resolve_callee(n, sc)
                        if target is not None and target[0].cls is None and target[0].parent is None:
                            top_level.append((target[0], n))
        # the function that turns rewards into advantages (found by the probe) is not the reward
        adv_funcs = getattr(self, "advantage_funcs", set())
        fns = {f.qual: (f, n) for f, n in top_level if id(f.node) not in adv_funcs}
        if len(fns) > 1:
            # reward helpers calling each other: keep the outermost one
            called = set()
            for f, _ in fns.values():
                for c in self.callees_closure(f.node.body):
                    called.add(c.qual)
            fns = {q: v for q, v in fns.items() if q not in called}
        if len(fns) == 1 and not inner:
            f, n = next(iter(fns.values()))
            model_param = next((p for p in f.params if re.search(r"(^|_)(model|backbone|rm|critic|classifier|"
                                                                  r"reward_model|scorer|pipe|pipeline)($|_)", p, re.I)),
                               None)
            if model_param is None:
                # by behaviour: the call site hands it a model object that it runs (clf(input_ids=...))
                model_param = self._model_passed(f, n)
            delegate = next((n for n in walk(f.node.body) if isinstance(n, cst.Call) and
                             isinstance(n.func, cst.Attribute) and isinstance(n.func.value, cst.Name) and
                             n.func.value.value in f.params and REWARD_RE.search(n.func.attr.value)), None)
            if model_param is None and delegate is not None:
                # the score comes from a method of an object the helper is handed (environment.reward(text)):
                # the reward is that object's, which no module path names
                a.warn(f"the reward helper {f.name}() ({self.loc(self.p.line(f.node))}) returns "
                       f"{_code(delegate.func)}() of an object it is given ({delegate.func.value.value}); "
                       "model.reward.args.path is left out: write reward_fn(response_text, ground_truth) -> float "
                       "around that object and set model.reward.args.path")
                return
            if model_param is not None:
                # get_reward(model, query_responses, tokenizer): a reward MODEL's forward, not a function of text
                a.warn(f"the reward helper {f.name}() ({self.loc(self.p.line(f.node))}) takes a model "
                       f"({model_param}): it is a reward model, not a reward function; model.reward.args.path is "
                       "left out. If it is a Hugging Face sequence classifier, set model.reward: {type: model, args: "
                       "{model_name_or_path: <dir>}}; otherwise write reward_fn(response_text, ground_truth) -> float")
                return
            where = getattr(self.p.line(f.node), "file", None)
            module = self.module_name
            if where is not None:
                # defined in a project module the script imports: that module's import path, never the script's
                quals = {q.lstrip(".") for q in self.p.imports.values() if q.lstrip(".").endswith("." + f.name)}
                if len(quals) != 1 or any(q.startswith(".") for q in self.p.imports.values()
                                          if q.lstrip(".") in quals):
                    a.warn(f"the reward function {f.name}() is defined in {where}, not in the script; "
                           "model.reward.args.path is left out: set it to that module's import path and "
                           f"function ('<module>:{f.name}')")
                    return
                module = quals.pop()[: -len(f.name) - 1]
            self.emit("model.reward.type", Known("function", self.p.line(f.node)))
            self.emit("model.reward.args.path", Known(f"{module}:{f.name}", self.p.line(f.node)))
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


    def _model_passed(self, f, site):
        """The parameter of *f* that a call site binds to a model object (built by ``from_pretrained``, a
        ``*Model*`` class or an ``nn.Module`` subclass of the project) and that *f* runs (calls it or a
        method of it); None when there is none. Decided by the call sites, not by the parameter's name."""
        called = set()
        for n in walk(f.node.body):
            if isinstance(n, cst.Call):
                root = n.func
                while isinstance(root, cst.Attribute):
                    root = root.value
                if isinstance(root, cst.Name):
                    called.add(root.value)
        names = sorted(f.params, key=lambda k: f.params[k][0])
        sites = ([site] if isinstance(site, cst.Call) else []) + \
            [c for c, _, _ in self.p.calls_by_callee().get(f.qual, []) if c is not site]
        for call in sites:
            scope = self.p.func_of(call)
            pos = 0
            for arg in call.args:
                if arg.keyword is not None:
                    pname = arg.keyword.value
                elif arg.star:
                    break
                else:
                    pname = names[pos] if pos < len(names) else None
                    pos += 1
                if pname is None or pname not in called:
                    continue
                exprs = [arg.value]
                if isinstance(arg.value, cst.Name):
                    exprs += [e for e in self.p.assignments_of(arg.value.value, scope) if e is not None]
                    exprs += [m.value for m, _ in self.p.nodes_of(cst.AnnAssign) if m.value is not None
                              and isinstance(m.target, cst.Name) and m.target.value == arg.value.value]
                for e in exprs:
                    for c in walk(e):
                        if isinstance(c, cst.Call):
                            last = _last(c.func) or ""
                            cls = self.p.classes.get(last)
                            if last == "from_pretrained" or "Model" in last or (cls is not None and any(
                                    re.search(r"Module|Model", _code(b.value)) for b in cls.bases)):
                                return pname
        return None
