"""Refusals that name the real blocker: what the loop does that MegatronTrainer's single-turn, on-policy
rollout cannot reproduce, decided by what the code does with its objects (where a buffer is filled and
drawn from, what a generation's output is used for, where the update runs), not by file or class names.

Each check returns the reason (with ``file:line``) or None; :meth:`refuse_blockers` refuses with the first
blockers found, so the report leads with why the script cannot migrate, not with a symptom of it.
"""

from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from .._static import walk
from .base import GEN_RE, REWARD_RE, _call_arg, _code, _kwarg, _last

WRITE_METHODS = ("push", "append", "extend", "add", "store", "insert", "put", "add_experience", "add_batch")
PREFERENCE_RE = re.compile(r"chosen|rejected|preferred|dispreferred|(^|_)(win|lose|winner|loser)(_|$)", re.I)


class RefusalsMixin:
    def refuse_blockers(self, main_loop) -> bool:
        """Refuse for a blocker that no config key expresses; True when refused."""
        checks = [self._ray_trainer, lambda: self._preference_loss(main_loop)]
        if main_loop is not None:
            checks += [lambda: self._multi_turn(main_loop), lambda: self._replay_buffer(main_loop),
                       lambda: self._greedy_baseline(main_loop)]
        found = False
        for check in checks:
            why = check()
            if why:
                self.a.refuse(why)
                found = True
        return found

    def loop_region(self, loop) -> list:
        """The loop and the functions it reaches, including methods of the project's classes called on
        objects whose class cannot be resolved statically (``trainer.generate_experience(...)`` where
        ``trainer`` comes from a factory): the methods of that name in the project's classes."""
        region = [loop] + [f.node for f in self.callees_closure(loop)]
        seen = {id(r) for r in region}
        methods: dict = {}
        for cname, cdef in self.p.classes.items():
            for st in cdef.body.body:
                if isinstance(st, cst.FunctionDef):
                    methods.setdefault(st.name.value, []).append(st)
        todo = list(region)
        while todo:
            cur = todo.pop()
            for n in walk(cur):
                if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value in methods \
                        and self.p.resolve_callee(n, self.p.func_of(n)) is None:
                    for fdef in methods[n.func.attr.value]:
                        if id(fdef) not in seen:
                            seen.add(id(fdef))
                            region.append(fdef)
                            todo.append(fdef)
        return region

    # ------------------------------------------------------------------ Ray actors, framework owners
    def _ray_trainer(self) -> Optional[str]:
        """A class run as a Ray actor (``@ray.remote``) whose methods compute gradients: the update runs
        in remote trainer processes driven by ``.remote()`` calls."""
        for name, cdef in self.p.classes.items():
            remote = [d for d in cdef.decorators if "remote" in _code(d.decorator) and
                      any(q.startswith("ray") for q in self.qn(d.decorator.func if isinstance(d.decorator, cst.Call)
                                                              else d.decorator))]
            if not remote:
                continue
            if any(isinstance(n, cst.Call) and _last(n.func) in ("backward", "step") for n in walk(cdef.body)):
                return (f"{self.loc(self.p.line(cdef))}: the policy update runs inside the Ray actor {name} "
                        "(@ray.remote), driven by .remote() calls from a controller loop; MegatronTrainer is a single "
                        "controller that owns generation and the update, so this Ray trainer cannot be rewritten "
                        "into it statically; write the algorithm's settings into a verl-bridge config by hand "
                        "(`verl-bridge init`) and point model.reward at the reward code")
        return None

    # ------------------------------------------------------------------ offline preference losses
    def _preference_loss(self, main_loop=None) -> Optional[str]:
        """DPO/IPO/KTO: a loss over a chosen/rejected pair of log-ratios (``-logsigmoid(beta * (...))`` or
        IPO's squared margin), trained on a fixed preference dataset; generation, if any, only evaluates.
        When the script has an RL loop, a preference loss in an imported project module counts only if
        the loop reaches it (a helpers module may also hold an unused DPO loss)."""
        reached = None
        if main_loop is not None:
            reached = {id(f.node) for f in self.callees_closure(main_loop)}
        for call, scope in self.calls:
            last = _last(call.func) or ""
            if last not in ("logsigmoid", "log_sigmoid"):
                continue
            if reached is not None and getattr(self.p.line(call), "file", None) is not None:
                funcs, f = set(), scope
                while f is not None:
                    funcs.add(id(f.node))
                    f = f.parent
                if not funcs & reached:
                    continue  # in a local module, outside what the training loop calls
            # the margin: directly in the argument, or through the names it is built from
            names = set(re.findall(r"\w+", _code(call)))
            todo, seen = list(names), set()
            while todo and len(seen) < 200:
                n = todo.pop()
                if n in seen:
                    continue
                seen.add(n)
                for e in self.p.assignments_of(n, scope):
                    if e is not None and not isinstance(e, cst.Call):
                        new = set(re.findall(r"\w+", _code(e))) - names
                        names |= new
                        todo.extend(new)
            if any(PREFERENCE_RE.search(n) for n in names):
                return (f"{self.loc(self.p.line(call))}: offline preference loss (DPO/IPO style): "
                        f"`{_code(call)[:80]}` over the log-ratios of chosen vs rejected responses from a fixed "
                        "preference dataset, not a policy gradient on rewards of responses sampled in a rollout; "
                        "verl-bridge migrates online PPO/GRPO loops only")
        return None

    # ------------------------------------------------------------------ multi-turn / tool use
    def _multi_turn(self, loop) -> Optional[str]:
        """Rollouts that interleave the model's turns with tool or environment output: TRL's
        TextEnvironment, or a trainer step given response masks that hide inserted (tool) tokens."""
        region = [loop] + [f.node for f in self.callees_closure(loop)]
        for call, scope in self.calls:
            if any(q.endswith("TextEnvironment") for q in self.qn(call.func)):
                return (f"{self.loc(self.p.line(call))}: multi-turn tool-use episodes: TRL's TextEnvironment "
                        "inserts tool outputs into the responses and the update trains with response masks that "
                        "exclude the tool tokens; MegatronTrainer generates one single-turn response per prompt, so "
                        "the tool calls and their masks would be lost; this script cannot be migrated")
        for r in region:
            for n in walk(r):
                if isinstance(n, cst.Call) and "trl_step" in self.call_tags(n):
                    masks = _kwarg(n, "response_masks")
                    pos = [a for a in n.args if a.keyword is None]
                    if masks is not None or len(pos) >= 4:
                        arg = masks if masks is not None else pos[3].value
                        return (f"{self.loc(self.p.line(n))}: the PPO step receives response masks "
                                f"(`{_code(arg)}`) that exclude part of each response (tool or environment output "
                                "in a multi-turn episode); MegatronTrainer trains on whole single-turn responses, "
                                "so this cannot be migrated")
        return None

    # ------------------------------------------------------------------ replay buffer across steps
    def _replay_buffer(self, loop) -> Optional[str]:
        """An object created before the training loop, filled with rollouts inside it and drawn from at
        random (``.sample(k)``) inside it without being emptied: updates reuse rollouts of earlier steps'
        policies (off-policy). A buffer drained each step (``pop()`` until empty, ``clear()``) is on-policy."""
        scope = self.p.func_of(loop)
        inside = [n for n in walk(loop.body) if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute)]
        written, sampled, cleared = {}, {}, set()
        for n in inside:
            recv = _code(n.func.value)
            m = n.func.attr.value
            if m in WRITE_METHODS:
                written.setdefault(recv, n)
            elif m == "sample" and not any(q.startswith(("random", "numpy", "torch")) for q in self.qn(n.func)):
                sampled.setdefault(recv, n)
            elif m in ("clear", "reset", "empty"):
                cleared.add(recv)
        for n in walk(loop.body):
            if isinstance(n, cst.Assign):
                for t in n.targets:
                    cleared.add(_code(t.target))
        for recv, call in sampled.items():
            if recv not in written or recv in cleared or not re.fullmatch(r"[\w.]+", recv):
                continue
            base = recv.split(".")[0]
            made = self.p.assignments_of(base, scope) if base != "self" else [None]
            if base != "self" and not any(isinstance(e, cst.Call) for e in made):
                continue
            return (f"{self.loc(self.p.line(call))}: off-policy training from a replay buffer: `{recv}` is created "
                    f"before the training loop, filled with new rollouts every step ({self.loc(self.p.line(written[recv]))}) "
                    f"and the updates draw random samples from it (`{_code(call)}`), including rollouts of earlier "
                    "steps' policies; MegatronTrainer trains on-policy on each step's own rollouts, so this replay "
                    "buffer cannot be expressed; this script cannot be migrated")
        return None

    # ------------------------------------------------------------------ ReMax greedy baseline
    def _greedy_baseline(self, loop) -> Optional[str]:
        """A second, greedy (``do_sample=False``) response per prompt inside the training step, scored by the
        reward: ReMax's baseline (advantage = reward - greedy reward). No verl-bridge estimator has it."""
        for r in self.loop_region(loop):
            for n in walk(r):
                if not isinstance(n, cst.Call):
                    continue
                ds = _kwarg(n, "do_sample")
                if ds is None or _code(ds) != "False":
                    continue
                if not (GEN_RE.match(_last(n.func) or "") or "generate" in (_last(n.func) or "")):
                    continue
                parent = self.p.parents.get(n)
                if not isinstance(parent, cst.Assign):
                    continue
                names = {_code(t.target) for t in parent.targets}
                func = self.p.func_of(n)
                body = func.node if func is not None else r
                for m in walk(body):
                    if isinstance(m, cst.Call) and m is not n and REWARD_RE.search(_code(m.func)) and \
                            any(set(re.findall(r"\w+", _code(a.value))) & names for a in m.args):
                        return (f"{self.loc(self.p.line(n))}: ReMax-style greedy baseline: every prompt also gets a "
                                f"greedy (do_sample=False) response (`{', '.join(sorted(names))}`) whose reward "
                                f"({self.loc(self.p.line(m))}) is the baseline subtracted from the sampled response's "
                                "reward; verl-bridge's estimators (GAE, GRPO, RLOO, REINFORCE++) have no greedy-decoding "
                                "baseline, so this script cannot be migrated with the same advantages")
        return None
