"""Where a value comes from when the code around it decides: branches the script's own defaults
settle (``if args.optimizer == "adam": Adam(...) else: AdamW(...)`` with ``optimizer = "adamw"``)."""

from __future__ import annotations

import re

import libcst as cst

from .._static import Known


CLIPPING_RE = re.compile(r"clip_grad_norm|clip_grad_value|max_grad_norm|gradient_clipping|grad_clip|clip_grad|"
                         r"clip_norm|max_norm")
VALUE_HEAD_RE = re.compile(r"critic|value|ScalarHead|ValueHead|vf_head|v_head", re.I)


# a role whose value the recognisers infer from an expression's shape, and the names a script gives
# the flag / field / constant that holds it
ROLE_NAMES = {
    "algorithm.lam": re.compile(r"(^|[._-])(lam|lmbda|lambd|lambda|gae_lambda|gae_lam|gae_lmbda)$", re.I),
    "algorithm.gamma": re.compile(r"(^|[._-])(gamma|discount|gae_gamma|discount_factor)$", re.I),
}


class ValuesMixin:
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
            if name in OPTIMIZERS and any(q.startswith("torch.optim") for q in qs):
                return name, {f"torch.optim.{name}"}
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
        evaluates to a proven False, or to True for the ``else``). Unknown tests are live."""
        child = node
        for anc in self.p.ancestors(node):
            if isinstance(anc, cst.If):
                test = self.p.ev(anc.test, scope)
                if isinstance(test, Known) and isinstance(test.value, bool):
                    in_body = child is anc.body
                    in_else = anc.orelse is not None and child is anc.orelse
                    if (in_body and test.value is False) or (in_else and test.value is True):
                        return True
            if isinstance(anc, cst.FunctionDef):
                return False
            child = anc
        return False
