"""Where a value comes from when the code around it decides: branches the script's own defaults
settle (``if args.optimizer == "adam": Adam(...) else: AdamW(...)`` with ``optimizer = "adamw"``)."""

from __future__ import annotations

import re

import libcst as cst

from .._static import Known, Runtime, walk
from .base import _call_arg, _kwarg, _last


CLIPPING_RE = re.compile(r"clip_grad_norm|clip_grad_value|max_grad_norm|gradient_clipping|grad_clip|clip_grad|"
                         r"clip_norm|max_norm")
VALUE_HEAD_RE = re.compile(r"critic|value|ScalarHead|ValueHead|vf_head|v_head", re.I)


# a role whose value the recognisers infer from an expression's shape, and the names a script gives
# the flag / field / constant that holds it
ROLE_NAMES = {
    "algorithm.lam": re.compile(r"(^|[._-])(lam|lmbda|lambd|lambda|gae_lambda|gae_lam|gae_lmbda)$", re.I),
    "algorithm.gamma": re.compile(r"(^|[._-])(gamma|discount|gae_gamma|discount_factor)$", re.I),
}


GROUP_KW_RE = re.compile(r"num_(answers?|samples|generations|responses|completions|rollouts)(_per_\w+)?|"
                         r"group_size|n_samples|num_return_sequences|samples_per_prompt|n_per_prompt", re.I)
SEED_CALLS = {"torch.manual_seed", "torch.random.manual_seed", "transformers.set_seed", "trl.set_seed",
              "accelerate.utils.set_seed", "lightning.seed_everything"}


class ValuesMixin:
    def extract_run_values(self) -> None:
        """trainer.seed, trainer.eval_every and data.rollout_batch_size where the loop's own code says so."""
        from .base import _call_arg, _find_modulo, _kwarg, _last

        loop = self.main_loop
        scope = self.loop_func
        for call, sc in self.calls:
            if self.qn(call.func) & SEED_CALLS and call.args and "trainer.seed" not in self.a.config:
                v = self.p.ev(call.args[0].value, sc)
                if isinstance(v, Known) and isinstance(v.value, int) and not isinstance(v.value, bool):
                    self.emit("trainer.seed", v, "the seed")
        # evaluation every N steps: `if step % N == 0: evaluate(...)` in the loop body
        for n in walk(loop.body):
            if isinstance(n, cst.If):
                m = _find_modulo(n.test)
                if m is None:
                    continue
                called = [_last(c.func) or "" for c in walk(n.body) if isinstance(c, cst.Call)]
                if any(re.search(r"(^|_)eval", c, re.I) for c in called):
                    self.emit("trainer.eval_every", self.p.ev(m, scope), "the evaluation interval")
                    break
        # responses per prompt, named at the rollout call in the loop body itself (an evaluation call
        # elsewhere may pass another count to the same helper): rollout(..., num_answer_per_question=G)
        if self.a.config.get("algorithm.name") in ("grpo", "rloo") and "algorithm.group_size" not in self.a.config:
            for n in walk(loop.body):
                if isinstance(n, cst.Call) and "gen" in self.call_tags(n):
                    for arg in n.args:
                        if arg.keyword is not None and GROUP_KW_RE.fullmatch(arg.keyword.value):
                            v = self.p.ev(arg.value, scope)
                            if isinstance(v, Known) and isinstance(v.value, int) and not isinstance(v.value, bool):
                                self.emit("algorithm.group_size", v, "the group size")
                                break
        self.manual_sampling()
        # prompts per step: a random draw of k prompts in the loop body that feeds the rollout
        if "data.rollout_batch_size" not in self.a.config:
            k = self.random_draw_size(loop, scope)
            if isinstance(k, Runtime) and "world size" in k.why:
                k = self.global_of_per_rank(lambda: self.random_draw_size(loop, scope), "the prompts drawn per step") or k
            if k is not None:
                self.emit("data.rollout_batch_size", k, "the prompts drawn per step")
        # prompts per step: the DataLoader the loop iterates
        if isinstance(loop, cst.For):
            it = loop.iter
            while isinstance(it, cst.Call) and _last(it.func) in ("enumerate", "tqdm", "iter") and it.args:
                it = it.args[0].value
            if isinstance(it, cst.Name):
                exprs = [e for e in self.p.assignments_of(it.value, scope) if e is not None]
                if len(exprs) == 1 and isinstance(exprs[0], cst.Call) and _last(exprs[0].func) == "DataLoader":
                    bs = _kwarg(exprs[0], "batch_size")
                    if bs is not None and "data.rollout_batch_size" not in self.a.config:
                        self.emit("data.rollout_batch_size", self.p.ev(bs, scope), "the prompts per step")

    def manual_sampling(self) -> None:
        """A hand-written decoding loop: ``torch.multinomial(softmax(logits), 1)`` samples at temperature 1
        (``softmax(logits / T)``: T) with neither top-k nor top-p when the function filters nothing
        (no topk / sort / cumsum / masked_fill of the logits)."""
        c = self.a.config
        if {"rollout.temperature", "rollout.top_p", "rollout.top_k"} <= set(c):
            return
        found = []
        for r in self.loop_region(self.main_loop):
            if not isinstance(r, cst.FunctionDef):
                continue
            info = self.p.funcs.get(id(r))
            for n in walk(r.body):
                if not (isinstance(n, cst.Call) and _last(n.func) == "multinomial" and n.args):
                    continue
                probs = n.args[0].value
                exprs = [probs] if not isinstance(probs, cst.Name) else \
                    [e for e in self.p.assignments_of(probs.value, info) if e is not None]
                if len(exprs) != 1 or not isinstance(exprs[0], cst.Call) or _last(exprs[0].func) != "softmax":
                    continue
                sm = exprs[0]
                x = sm.args[0].value if sm.args and sm.args[0].keyword is None else None
                if isinstance(sm.func, cst.Attribute) and not (isinstance(sm.func.value, cst.Name) and
                                                                sm.func.value.value in ("torch", "F", "nn")):
                    x = sm.func.value  # logits.softmax(-1)
                if x is None:
                    continue
                filt = {(_last(c2.func) or "") for c2 in walk(r.body) if isinstance(c2, cst.Call)}
                if filt & {"topk", "sort", "cumsum", "masked_fill", "masked_fill_", "top_k_top_p_filtering"}:
                    continue
                temp = Known(1.0, self.p.line(sm))
                if isinstance(x, cst.BinaryOperation) and isinstance(x.operator, cst.Divide):
                    temp = self.p.ev(x.right, info)
                elif not isinstance(x, (cst.Name, cst.Subscript, cst.Attribute)):
                    continue
                found.append((temp, self.p.line(sm)))
        if len(found) != 1:
            return
        temp, line = found[0]
        self.emit("rollout.temperature", temp if isinstance(temp, Known) else None, "the sampling temperature")
        self.emit("rollout.top_p", Known(1.0, line))
        self.emit("rollout.top_k", Known(0, line))
        self.a.warn(f"{self.loc(line)}: tokens are sampled by hand (multinomial over the softmax of the logits, "
                    "no top-k/top-p filtering): rollout.top_p 1.0, rollout.top_k 0")

    def random_draw_size(self, loop, scope):
        """k of ``idx = torch.randperm(n)[:k]`` / ``np.random.permutation(n)[:k]`` / ``random.sample(xs, k)``
        / ``rng.choice(n, k, replace=False)`` run once per iteration of *loop* (not in an inner loop or a
        branch) when what it draws reaches the rollout call; None otherwise."""
        body = loop.body.body if isinstance(loop.body, cst.IndentedBlock) else []
        gen_calls = [n for n in walk(loop.body) if isinstance(n, cst.Call) and
                     ("gen" in self.call_tags(n) or (lambda t: t is not None and "gen" in self.reach(t[0].node))(
                         self.p.resolve_callee(n, self.p.func_of(n))))]
        for i, st in enumerate(body):
            if not isinstance(st, cst.SimpleStatementLine) or not isinstance(st.body[0], cst.Assign):
                continue
            a = st.body[0]
            if len(a.targets) != 1 or not isinstance(a.targets[0].target, cst.Name):
                continue
            k = _draw_count(a.value, self.qn)
            if k is None:
                continue
            # what it draws, and names computed from it, reach the rollout call
            names = {a.targets[0].target.value}
            for later in body[i + 1:]:
                for n in walk(later):
                    if isinstance(n, cst.Assign) and {x.value for x in walk(n.value) if isinstance(x, cst.Name)} & names:
                        names |= {x.value for t in n.targets for x in walk(t.target) if isinstance(x, cst.Name)}
            if any({x.value for x in walk(c) if isinstance(x, cst.Name)} & names for c in gen_calls):
                return self.p.ev(k, scope)
        return None

    def drop_role_conflicts(self) -> None:
        """A GAE coefficient reported as certain while a flag / field / constant NAMED for that role,
        with a different value, is not used (listed in ``unmapped``): the value came from the shape of
        an expression (``ret = r + gamma * ret`` read as lambda 1), not from the role's own name. Both
        are left out, the key goes to ``unmapped`` with its source, and a warning says why."""
        a = self.a
        for key, rx in ROLE_NAMES.items():
            if key not in a.config or key in getattr(self, "framework_defaults", {}):
                continue
            mine = a.config[key]
            for u in list(a.unmapped):
                name, _, rest = u.partition("=")
                val = rest.split(" (", 1)[0]
                try:
                    v = float(val)
                except ValueError:
                    continue
                if not rx.search(name.lstrip("-").replace("-", "_")):
                    continue
                if isinstance(mine, (int, float)) and not isinstance(mine, bool) and float(mine) == v:
                    continue
                where = a.provenance.pop(key, "?")
                a.config.pop(key)
                a.unmapped.append(f"{key}={mine!r} ({where}; left out: contradicts {u})")
                a.warn(f"{key} is left out: the loop's expression at {where} gives {mine!r}, but {u} is named for "
                       f"that role and is not used where the value was read; set {key} by hand")
                break

    def no_clipping_default(self) -> None:
        """No gradient clipping anywhere in the script or its local modules: ``optim.actor.clip_grad``
        is 0 (off), named as the script's choice, not left to verl-bridge's default of 1.0."""
        if "optim.actor.clip_grad" in self.a.config:
            return
        # Megatron-LM's optimizer clips at --clip-grad (default 1.0), other engines take it from their own
        # configs; DeepSpeed clips only with "gradient_clipping" in its config (default 0.0, the regex above)
        if any(q.split(".")[0] in ("megatron", "apex", "nemo", "colossalai", "lightning",
                                   "pytorch_lightning") for q in self.p.imports.values()):
            return
        for mod in self.p.modules:
            if CLIPPING_RE.search(mod.code):
                return
        self.emit_default("optim.actor.clip_grad", 0.0, "the script clips no gradients (no clip_grad_norm_, "
                          "max_grad_norm or gradient_clipping anywhere): 0 = off")

    def shared_value_head_lr(self, params, scope, lr_node) -> None:
        """One optimizer over a model that carries the value head (``PolicyAndValueWrapper(policy,
        critic)``, ``AutoModelForCausalLMWithScalarHead``): the critic trains at the actor's lr."""
        if params is None or lr_node is None or "optim.critic.lr" in self.a.config:
            return
        base = params
        while isinstance(base, (cst.Call, cst.Attribute)):
            base = base.func if isinstance(base, cst.Call) else base.value
        if not isinstance(base, cst.Name):
            return
        exprs = [e for e in self.p.assignments_of(base.value, scope) if e is not None]
        if len(exprs) != 1 or not isinstance(exprs[0], cst.Call):
            return
        built = exprs[0]
        text = cst.Module(body=[]).code_for_node(built.func) + " " + " ".join(
            cst.Module(body=[]).code_for_node(x.value) for x in built.args)
        if not VALUE_HEAD_RE.search(text):
            return
        lr = self.p.ev(lr_node, scope)
        if isinstance(lr, Known):
            self.emit("optim.critic.lr", lr, "the critic learning rate")
            self.a.warn(f"{self.loc(self.p.line(built))}: one optimizer trains the policy and the value head "
                        f"({base.value}); optim.critic.lr is the same lr. MegatronTrainer trains a separate critic, so "
                        "the shared backbone is not shared any more")

    def local_optimizer_base(self, call):
        """``AdamTensorFlowStyle(params, lr=..., eps=...)`` where the script defines
        ``class AdamTensorFlowStyle(optim.Adam)``: (base name, its qualified names), or None."""
        from .base import OPTIMIZERS, _last

        if not isinstance(call.func, cst.Name) or call.func.value not in self.p.classes:
            return None
        cdef = self.p.classes[call.func.value]
        for b in cdef.bases:
            name = _last(b.value) or ""
            qs = self.qn(b.value)
            if name in OPTIMIZERS and (any(q.startswith("torch.optim") for q in qs) or name in ("Adam", "AdamW")):
                return name, {f"torch.optim.{name}"}
        return None

    def gated_step(self, loop, step_node, scope):
        """Inside the strided loop ``for i in range(0, n, micro)``, ``optimizer.step()`` runs only under
        ``if counter % k == 0`` (gradient accumulation): the samples per optimizer step - ``k`` when the
        counter counts samples (``total_samples += micro``), ``micro * k`` when it counts micro-steps.
        None when the step is not gated (every iteration steps), or the counter is not clear."""
        from .base import _find_modulo, _last

        if loop is None:
            return None
        for n in walk(loop.body):
            if not (isinstance(n, cst.Call) and _last(n.func) == "step" and isinstance(n.func, cst.Attribute)
                    and re.search(r"optim|opt\b|engine", cst.Module(body=[]).code_for_node(n.func.value), re.I)):
                continue
            for anc in self.p.ancestors(n):
                if anc is loop:
                    return None
                if isinstance(anc, cst.If):
                    m = _find_modulo(anc.test)
                    left = next((b.left for b in walk(anc.test) if isinstance(b, cst.BinaryOperation)
                                 and isinstance(b.operator, cst.Modulo)), None)
                    if m is None or not isinstance(left, cst.Name):
                        return None
                    k = self.p.ev(m, scope)
                    if not isinstance(k, Known):
                        return k if not isinstance(k, Known) and k is not None else None
                    incs = [a for a in walk(loop.body) if isinstance(a, cst.AugAssign)
                            and isinstance(a.target, cst.Name) and a.target.value == left.value]
                    if len(incs) != 1:
                        return None
                    inc = incs[0].value
                    if isinstance(inc, cst.Integer) and inc.value == "1":
                        micro = self.p.ev(step_node, scope)
                        if isinstance(micro, Known) and isinstance(micro.value, int) and isinstance(k.value, int):
                            return Known(micro.value * k.value, k.line)
                        return None
                    if re.search(r"sample|seen|processed|example", left.value, re.I):
                        return k
                    return None
        return None

    def whole_batch_step(self, stop, step, scope) -> bool:
        """``range(0, args.batch, args.mini)`` with ``args.mini = exact_div(args.batch, args.nminibatches)``
        (or ``args.batch // n``) and n = 1 by default: one minibatch, the whole batch (mini_batch_size null)."""
        from .base import _code, _last

        def stored(node):
            if isinstance(node, cst.Attribute):
                hits = self.p.attr_stores().get(node.attr.value, [])
                if len(hits) == 1 and hits[0][1] is not None:
                    return hits[0][1], hits[0][2]
            if isinstance(node, cst.Name):
                exprs = [e for e in self.p.assignments_of(node.value, scope) if e is not None]
                if len(exprs) == 1:
                    return exprs[0], scope
            return None, None

        expr, sc = stored(step)
        if expr is None:
            return False
        if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) and len(expr.args) == 2 and \
                "div" in expr.func.value.lower():  # exact_div(a, b) / safe_div(a, b)
            num, den = expr.args[0].value, expr.args[1].value
        elif isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, (cst.FloorDivide, cst.Divide)):
            num, den = expr.left, expr.right
        else:
            return False
        same = _code(num) == _code(stop) or (_last(num) is not None and _last(num) == _last(stop)
                                              and isinstance(num, cst.Attribute) and isinstance(stop, cst.Attribute))
        d = self.p.ev(den, sc)
        return same and isinstance(d, Known) and d.value == 1 and not isinstance(d.value, bool)

    def bind_at_loop_site(self, node, scope):
        """A parameter of a helper the loop calls (``sample_group(..., heat=cfg["sampling"]["heat"])``),
        whose other callers (an evaluation pass) pass other values: its value at the loop's call."""
        if not (isinstance(node, cst.Name) and scope is not None and node.value in scope.params
                and node.value not in scope.assigns):
            return None
        loop = getattr(self, "main_loop", None)
        if loop is None:
            return None
        sites = []
        for c in walk(loop):
            if isinstance(c, cst.Call):
                t = self.p.resolve_callee(c, self.loop_func)
                if t is not None and t[0] is scope:
                    sites.append((c, t[1]))
        if len(sites) != 1:
            return None
        call, offset = sites[0]
        idx, param = scope.params[node.value]
        arg = self.p._arg_for(call, idx, node.value, offset)
        if arg == "star":
            return None
        if arg is None:
            return self.p.ev(param.default, None) if param.default is not None else None
        return self.p.ev(arg, self.loop_func)

    def none_by_default(self, node, scope) -> bool:
        """*node* is None with the script's defaults: ``optimizer = None`` and an ``optimizer = Adafactor(...)``
        only under ``if args.adafactor:`` (default False). TRL then builds its own Adam at learning_rate."""
        if isinstance(node, cst.Name) and node.value == "None":
            return True
        if not isinstance(node, cst.Name):
            return False
        exprs = self.p.assignments_of(node.value, scope)
        live = [e for e in exprs if e is not None and not self.statically_dead(e, scope)]
        if None in exprs or not live:
            return False
        return all(isinstance(e, cst.Name) and e.value == "None" for e in live)

    def statically_dead(self, node, scope) -> bool:
        """*node* sits in a branch that the values the script runs with never take (the ``if`` test
        evaluates to a proven False, or to True for the ``else``). Unknown tests are live; only a test
        that evaluates to a bool counts (:meth:`Program.dead` with the strict test)."""
        def strict(test, sc):
            ev = self.p.ev(test, sc)
            return ev.value if isinstance(ev, Known) and isinstance(ev.value, bool) else None

        return self.p.dead(node, scope, truth=strict, stop=(cst.FunctionDef,))


def _draw_count(value, qn):
    """The count node of a random draw without replacement, or None."""
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and not value.args and \
            value.func.attr.value in ("tolist", "numpy", "cpu", "long", "int"):
        value = value.func.value  # torch.randperm(n)[:k].tolist(): the same k indices
    if isinstance(value, cst.Subscript) and isinstance(value.value, cst.Call) and len(value.slice) == 1:
        inner, sl = value.value, value.slice[0].slice
        if (_last(inner.func) or "") in ("randperm", "permutation") and isinstance(sl, cst.Slice) and \
                sl.lower is None and sl.step is None and sl.upper is not None:
            return sl.upper
    if isinstance(value, cst.Call):
        last = _last(value.func) or ""
        qs = qn(value.func)
        if last == "sample" and any(q.startswith("random.") for q in qs) and len(value.args) >= 2:
            return value.args[1].value
        if last == "choice":
            rep = _kwarg(value, "replace")
            size = _call_arg(value, 1, "size")
            if rep is not None and isinstance(rep, cst.Name) and rep.value == "False" and size is not None:
                return size
    return None
