"""On-policy policy-gradient updates: ``-logp * advantage`` with no probability ratio.

With one optimizer step per rollout batch, the clipped PPO/GRPO objective at ``ppo_epochs: 1`` and one
minibatch has the same gradient as the plain policy gradient (the ratio is 1 where the gradient is taken),
so such a loop migrates as the matching algorithm with ``algorithm.ppo_epochs: 1``; the clip range then has
no effect, and the report says so. Several optimizer steps per rollout batch without a ratio is a
different objective (later steps train on stale samples without correction): refused, naming the step.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .._static import Known, walk
from .base import SCHEDULER_RE, _code, _kwarg, _last


class PolicyGradientMixin:
    def optimizer_steps(self, loop) -> list:
        """``(call, function node)`` of every ``X.step()`` in the loop's reach that updates parameters
        (not a scheduler, not TRL's PPOTrainer.step)."""
        out = []
        for r in self.loop_region(loop):
            for n in walk(r):
                if not (isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value == "step"):
                    continue
                if n.args or SCHEDULER_RE.search(_code(n.func.value)) or "sched" in _code(n.func.value).lower():
                    continue
                out.append((n, r))
        return out

    def check_on_policy(self) -> bool:
        """No clipped ratio: migrate as on-policy PG with ppo_epochs 1 when every optimizer step runs once
        per iteration of the training loop; otherwise refuse naming why. True when it may migrate."""
        a = self.a
        loop = self.main_loop
        steps = self.optimizer_steps(loop)
        where = self.loc(self.p.line(loop))
        if not steps:
            a.refuse(f"{where}: the loop has no clipped probability ratio and no optimizer.step() was found in its "
                     "reach, so how often the policy is updated per rollout batch is unknown; call optimizer.step() "
                     "in the training loop (or a function it calls)")
            return False
        for call, region in steps:
            inner = [anc for anc in self.p.ancestors(call)
                     if isinstance(anc, (cst.For, cst.While)) and anc is not loop and any(x is region for x in self.p.ancestors(anc))
                     or (isinstance(anc, (cst.For, cst.While)) and anc is not loop and region is loop)]
            inner = [l for l in inner if any(x is loop for x in self.p.ancestors(l)) or region is not loop]
            # a loop that itself generates is the rollout loop (one batch per iteration), not extra updates
            inner = [l for l in inner if "gen" not in self.reach(l)]
            if len(inner) == 1 and self.deepspeed_accumulates(call, inner[0]):
                inner = []
            if inner:
                a.refuse(f"{self.loc(self.p.line(call))}: the update has no probability ratio (plain policy gradient) "
                         f"but `{_code(call)}` runs inside an inner loop ({self.loc(self.p.line(inner[0]))}), so "
                         "there may be several optimizer steps per rollout batch; after the first, the samples are "
                         "off-policy and uncorrected, which no MegatronTrainer setting reproduces; make it one "
                         "optimizer step per rollout batch (accumulate gradients) or use a clipped ratio")
                return False
        line = self.p.line(steps[0][0])
        self.on_policy = line
        self.emit("algorithm.ppo_epochs", Known(1, line))
        a.warn(f"on-policy policy gradient: the loss has no probability ratio and {_code(steps[0][0])} "
               f"({self.loc(line)}) runs once per rollout batch, the same objective as one PPO epoch with one "
               "minibatch: algorithm.ppo_epochs is 1, and the clip range (clip_ratio) has no effect there")
        return True

    def deepspeed_accumulates(self, call, inner) -> bool:
        """``engine.step()`` of a DeepSpeed engine in each iteration of *inner* updates the weights only at
        the gradient-accumulation boundary: one update per pass of the loop when the engine's config sets
        ``gradient_accumulation_steps`` to the loop's count (``range(0, N, m)`` with ``N // m``, or equal
        static numbers)."""
        if not (isinstance(call.func, cst.Attribute) and isinstance(call.func.value, cst.Name)):
            return False
        engine = call.func.value.value
        scope = self.p.func_of(inner)
        rec = None
        for c, sc in self.calls:
            if "deepspeed.initialize" not in self.qn(c.func) or sc is not scope:
                continue
            parent = self.p.parents.get(c)
            if not (isinstance(parent, cst.Assign) and len(parent.targets) == 1):
                continue
            t = parent.targets[0].target
            t = t.elements[0].value if isinstance(t, (cst.Tuple, cst.List)) and t.elements else t
            if isinstance(t, cst.Name) and t.value == engine:
                cfg = _kwarg(c, "config") or _kwarg(c, "config_params")
                rec = self.p.ev_record(cfg, sc) if cfg is not None else None
        if rec is None or "gradient_accumulation_steps" not in rec.fields or \
                not isinstance(inner, cst.For) or not isinstance(inner.iter, cst.Call) or \
                _last(inner.iter.func) not in ("range", "trange"):
            return False
        args = [a.value for a in inner.iter.args if a.keyword is None]
        ga = rec.fields["gradient_accumulation_steps"]
        ga_node = ga[0] if isinstance(ga, tuple) else None
        if len(args) == 3 and isinstance(args[0], cst.Integer) and args[0].value == "0" and \
                isinstance(ga_node, cst.BinaryOperation) and isinstance(ga_node.operator, cst.FloorDivide) and \
                _code(ga_node.left) == _code(args[1]) and _code(ga_node.right) == _code(args[2]) and \
                all(len(scope.assigns.get(n.value, [])) <= 1 for n in walk(inner.iter) if isinstance(n, cst.Name)):
            return True
        count = self.loop_count(inner, scope)
        ga_ev = self.p.record_field(rec, "gradient_accumulation_steps", rec.line)
        return isinstance(count, Known) and isinstance(ga_ev, Known) and count.value == ga_ev.value

    def on_policy_minibatch(self) -> None:
        """One optimizer step per rollout batch: the minibatch is the whole batch, prompts per step times
        responses per prompt (left out unless both are proven)."""
        c = self.a.config
        if not getattr(self, "on_policy", None) or "algorithm.mini_batch_size" in c:
            return
        rb = c.get("data.rollout_batch_size")
        g = c.get("algorithm.group_size") if c.get("algorithm.name") in ("grpo", "rloo") else 1
        if isinstance(rb, int) and isinstance(g, int) and not isinstance(rb, bool) and g >= 1:
            self.a.config["algorithm.mini_batch_size"] = rb * g
            self.a.provenance["algorithm.mini_batch_size"] = self.loc(self.on_policy)
            self.a.warn(f"algorithm.mini_batch_size = {rb * g}: one optimizer step per rollout batch "
                        f"({self.loc(self.on_policy)}) of {rb} prompts x {g} responses")
        elif "data.rollout_batch_size" not in c:
            # the batch's size is not static, but the step is once per batch: one minibatch, the whole batch
            self.a.config["algorithm.mini_batch_size"] = None
            self.a.provenance["algorithm.mini_batch_size"] = self.loc(self.on_policy)
            self.a.warn(f"algorithm.mini_batch_size is null (the whole rollout batch): one optimizer step per rollout "
                        f"batch ({self.loc(self.on_policy)})")
