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
from .base import SCHEDULER_RE, _code, _last


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
