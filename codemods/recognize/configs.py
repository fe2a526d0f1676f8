"""Config sites: optimizers, rollout sampling, parallel sizes, checkpoints, hooks, unsupported features."""

from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from .._static import FuncInfo, Known, Record, Runtime, dotted, walk
from .base import (ENTROPY_RE, GEN_RE, LOSS_RE, OLD_NAME_RE, OPTIMIZERS, REF_NAME_RE, REWARD_RE, SCHEDULER_RE,
                   VALUE_LOSS_RE, _MISSING, _call_arg, _code, _factors, _find_modulo, _is_one, _kwarg, _last,
                   _names_in)


class ConfigSitesMixin:
    def call_kwargs(self, call, scope) -> dict:
        """Keyword arguments of *call*, ``**kwargs`` dicts expanded (``generate(q, **generation_kwargs)``):
        name -> (value node, scope) or an evaluated Known/Runtime."""
        out: dict = {}
        for arg in call.args:
            if arg.keyword is not None:
                out[arg.keyword.value] = (arg.value, scope)
            elif arg.star == "**":
                rec = self.p.ev_record(arg.value, scope)
                if rec is None and re.search(r"kwargs|gen|sampl|config|cfg|params", _code(arg.value), re.I):
                    self.a.warn(f"{self.loc(self.p.line(arg))}: **{_code(arg.value)} is not a static dict; sampling "
                                "settings inside it are not read")
                if rec is None:
                    continue
                for k, v in rec.fields.items():
                    out.setdefault(k, v)
        return out

    def kw_ev(self, kws: dict, name: str):
        v = kws.get(name)
        if v is None:
            return None
        if isinstance(v, (Known, Runtime)):
            return v
        node, sc = v
        got = self.p.ev(node, sc)
        if got is None:
            got = self.bind_at_loop_site(node, sc)  # values.py: the loop's own call of the helper
        return got

    def rollout_kwargs(self, call, scope, info: Optional[FuncInfo] = None) -> None:
        names = {"temperature": "rollout.temperature", "top_p": "rollout.top_p",
                 "max_new_tokens": "data.max_response_length", "max_response_length": "data.max_response_length",
                 "response_length": "data.max_response_length", "max_gen_len": "data.max_response_length",
                 "max_tokens": "data.max_response_length"}
        kws = self.call_kwargs(call, scope)
        for arg in call.args:
            # generate(model, queries, tokenizer, generation_config) / generate(..., generation_config=gc)
            # with gc = GenerationConfig(max_new_tokens=..., temperature=...): its fields are the kwargs
            if arg.star or not isinstance(arg.value, (cst.Name, cst.Attribute, cst.Call)):
                continue
            rec = self.p.ev_record(arg.value, scope)
            if rec is not None and rec.kind in ("call:GenerationConfig", "call:SamplingParams"):
                for k, v in rec.fields.items():
                    kws.setdefault(k, v)
        for kw, key in names.items():
            if kw in kws and key == "data.max_response_length" and self._sampler_call(kws[kw]):
                self.length_sampler(self._sampler_call(kws[kw]), call)
            elif kw in kws:
                self.emit(key, self.kw_ev(kws, kw), kw)
            elif info is not None and kw in info.params:
                self.emit(key, self.p.ev_param(info, kw), kw)
        if "top_k" in kws or (info is not None and "top_k" in info.params):
            v = self.kw_ev(kws, "top_k") if "top_k" in kws else self.p.ev_param(info, "top_k")
            if isinstance(v, Known) and isinstance(v.value, (int, float)) and not isinstance(v.value, bool) \
                    and float(v.value).is_integer() and v.value >= -1:
                # rollout.top_k: 0 = off (HF's top_k=0 and vLLM's top_k=-1 both mean "no top-k")
                self.emit("rollout.top_k", Known(max(int(v.value), 0), v.line), "top_k")
            elif isinstance(v, Known) and v.value is not None:
                self.a.warn(f"{self.loc(v.line)}: top_k={v.value!r} is not an integer; rollout.top_k is left out")
        sampler = kws.get("length_sampler")
        if sampler is not None and "data.max_response_length" not in self.a.config:
            self.length_sampler(sampler, call)
        if "max_length" in kws and "max_new_tokens" not in kws and info is None and \
                not self._budget_over_prompt(call, kws):  # max_length = budget + prompt length: emitted there
            self.a.warn(f"{self.loc(self.p.line(call))}: max_length counts prompt and response together; "
                        "data.max_response_length is left out")

    def _budget_over_prompt(self, call, kws) -> bool:
        """``generate(ids, max_length=budget + ids.shape[1])``: the total length is the prompt's own length
        plus a response budget, so the budget is data.max_response_length. True when emitted."""
        v = kws.get("max_length")
        if not isinstance(v, tuple):
            return False
        node, sc = v
        for _ in range(3):
            if not isinstance(node, cst.Name):
                break
            exprs = [e for e in self.p.assignments_of(node.value, sc) if e is not None]
            if len(exprs) != 1:
                return False
            node = exprs[0]
        if not (isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add)):
            return False
        inp = _call_arg(call, 0, "input_ids")
        if inp is None:
            inp = _kwarg(call, "inputs")
        if inp is None:
            return False
        inp_code = _code(inp)

        def prompt_len(e) -> bool:
            # ids.shape[1] / ids.shape[-1] / ids.size(1) / ids.size(-1) / len(ids) of the generate input
            if isinstance(e, cst.Subscript) and isinstance(e.value, cst.Attribute) and e.value.attr.value == "shape":
                idx = e.slice[0].slice if len(e.slice) == 1 and isinstance(e.slice[0].slice, cst.Index) else None
                return idx is not None and _code(idx.value).replace(" ", "") in ("1", "-1") and \
                    _code(e.value.value) == inp_code
            if isinstance(e, cst.Call) and isinstance(e.func, cst.Attribute) and e.func.attr.value == "size":
                return len(e.args) == 1 and _code(e.args[0].value).replace(" ", "") in ("1", "-1") and \
                    _code(e.func.value) == inp_code
            return False

        for mine, other in ((node.left, node.right), (node.right, node.left)):
            if prompt_len(mine):
                ev = self.p.ev(other, sc)
                if isinstance(ev, Known) and isinstance(ev.value, int) and not isinstance(ev.value, bool):
                    self.emit("data.max_response_length", ev, "max_length minus the prompt length")
                    return True
                return False
        return False

    def _sampler_call(self, value):
        """``gen_kwargs["max_new_tokens"] = output_length_sampler()``: (the sampler, its scope) or None."""
        if not isinstance(value, tuple):
            return None
        node, sc = value
        if isinstance(node, cst.Name):
            exprs = [e for e in self.p.assignments_of(node.value, sc) if e is not None]
            if len(exprs) == 1:
                node = exprs[0]
        if isinstance(node, cst.Call) and not node.args and isinstance(node.func, cst.Name):
            for e in self.p.assignments_of(node.func.value, sc):
                if isinstance(e, cst.Call) and (_last(e.func) or "") == "LengthSampler":
                    return (node.func, sc)
        return None

    def length_sampler(self, sampler, call) -> None:
        """TRL ``LengthSampler(min, max)`` draws from ``range(min, max)`` (trl/core.py): the longest response
        is ``max - 1`` tokens. MegatronTrainer has one fixed length: take the longest, and say so."""
        node, sc = sampler if isinstance(sampler, tuple) else (None, None)
        exprs = [node] if isinstance(node, cst.Call) else []
        if isinstance(node, cst.Name):
            exprs = [e for e in self.p.assignments_of(node.value, sc) if e is not None]
        for e in exprs:
            if isinstance(e, cst.Call) and (_last(e.func) or "") == "LengthSampler":
                lo = self.p.ev(_call_arg(e, 0, "min_value"), sc)
                hi = self.p.ev(_call_arg(e, 1, "max_value"), sc)
                if isinstance(lo, Known) and isinstance(hi, Known) and isinstance(hi.value, int):
                    self.emit("data.max_response_length", Known(hi.value - 1, hi.line), "max_value")
                    self.a.warn(f"{self.loc(self.p.line(e))}: LengthSampler({lo.value}, {hi.value}) samples response "
                                f"lengths {lo.value}..{hi.value - 1} per batch; MegatronTrainer uses one maximum, "
                                f"data.max_response_length={hi.value - 1} (responses may still stop early at EOS)")
                else:
                    self.a.warn(f"{self.loc(self.p.line(e))}: the LengthSampler bounds are not static; "
                                "data.max_response_length is left out")
                return

    def extract_rollout(self) -> None:
        for call, scope in self.calls:
            if "gen" not in self.call_tags(call):
                continue
            if call not in [n for n in walk(self.main_loop)] and scope is self.loop_func:
                continue
            if scope is not None and re.search(r"eval|valid|(^|_)test", scope.name, re.I):
                continue  # generation for evaluation (other lengths / temperatures) is not the rollout
            t = self.p.resolve_callee(call, scope)
            self.rollout_kwargs(call, scope, t[0] if t else None)
        # prompts per step: an explicit batch-size argument of the prompt sampler in the main loop
        for n in walk(self.main_loop.body):
            if isinstance(n, cst.Call):
                for kw in ("rollout_batch_size", "num_prompts", "n_prompts", "prompts_per_step"):
                    v = _kwarg(n, kw)
                    if v is not None:
                        self.emit("data.rollout_batch_size", self.p.ev(v, self.loop_func), kw)
                t = self.p.resolve_callee(n, self.loop_func)
                if t is not None:
                    for kw in ("rollout_batch_size", "num_prompts", "n_prompts", "prompts_per_step"):
                        if kw in t[0].params and _kwarg(n, kw) is None:
                            self.emit("data.rollout_batch_size", self.p.ev_param(t[0], kw), kw)

    def extract_optimizers(self, trl: bool) -> None:
        a = self.a
        found_actor = False
        for call, scope in self.calls:
            last = _last(call.func) or ""
            qs = self.qn(call.func)
            alias = self.optimizer_alias(call, scope)
            if alias is not None:
                last, qs = alias
            sub_opt = self.local_optimizer_base(call)  # values.py: class MyAdam(torch.optim.Adam)
            if sub_opt is not None and not self.statically_dead(call, scope):
                a.warn(f"{self.loc(self.p.line(call))}: the optimizer {last} is the script's own subclass of "
                       f"{sub_opt[0]} (its own step()); MegatronTrainer uses its standard optimizer with the same "
                       "lr / eps / weight decay")
                last, qs = sub_opt
            is_opt = last in OPTIMIZERS and (any(q.startswith(("torch.optim", "apex", "deepspeed", "bitsandbytes", "transformers", "lion"))
                                                 for q in qs) or last in ("AdamW", "Adam", "FusedAdam"))
            if is_opt and self.statically_dead(call, scope):
                continue  # the branch the script's defaults never take (values.py)
            if is_opt:
                params = _call_arg(call, 0, "params")
                role = "critic" if params is not None and re.search(r"critic|value|vf", self._params_code(params, scope),
                                                                    re.I) else "actor"
                lr = _call_arg(call, 1, "lr") if last in ("Adam", "AdamW", "SGD", "RMSprop", "Adagrad") else _kwarg(call, "lr")
                self.emit(f"optim.{role}.lr", self.p.ev(lr, scope) if lr is not None else None,
                          f"the {role} learning rate" if lr is not None else "")
                wd = _kwarg(call, "weight_decay")
                if wd is not None and role == "actor":
                    self.emit("optim.actor.weight_decay", self.p.ev(wd, scope), "the weight decay")
                if role == "actor":
                    found_actor = True
                    self.check_lr_constants(lr, scope)
                    self.optimizer_defaults(call, scope, last, qs, wd)
                    self.shared_value_head_lr(params, scope, lr)  # values.py
            elif last == "OptimizerConfig":
                for kw, key in (("lr", "optim.actor.lr"), ("weight_decay", "optim.actor.weight_decay"),
                                ("clip_grad", "optim.actor.clip_grad")):
                    v = _kwarg(call, kw)
                    if v is not None:
                        self.emit(key, self.p.ev(v, scope), kw)
                found_actor = True
                self.check_lr_constants(_kwarg(call, "lr"), scope)
            elif last == "setup_model_and_optimizer":
                parent = self.p.parents.get(call)
                target = parent.targets[0].target if isinstance(parent, cst.Assign) else None
                if isinstance(target, cst.Tuple) and len(target.elements) > 1 and \
                        _code(target.elements[1].value) == "_":
                    continue  # a frozen copy (reference model): its optimizer is thrown away
                rec = self.p.args_record()
                for k, key in (("lr", "optim.actor.lr"), ("weight_decay", "optim.actor.weight_decay"),
                               ("clip_grad", "optim.actor.clip_grad")):
                    ev = self.p.record_field(rec, k, self.p.line(call))
                    if isinstance(ev, Runtime):
                        ev = Runtime(f"setup_model_and_optimizer() reads args.{k}, which is not set in this file "
                                     "(a Megatron-LM command-line flag)", self.p.line(call))
                    self.emit(key, ev, f"args.{k}")
                found_actor = True
            elif last in ("clip_grad_norm_", "clip_grad_norm"):
                params = _call_arg(call, 0, "parameters")
                v = _call_arg(call, 1, "max_norm")
                if params is not None and re.search(r"critic|value|vf", _code(params), re.I):
                    continue
                if v is not None:
                    self.emit("optim.actor.clip_grad", self.p.ev(v, scope), "the gradient clipping norm")
            elif SCHEDULER_RE.search(last) or any(SCHEDULER_RE.search(q) for q in qs):
                a.warn(f"custom learning-rate schedule {last}() at {self.loc(self.p.line(call))} is not supported; "
                       "MegatronTrainer uses a constant LR (with optim.actor.warmup_steps)")
        for node, _scope in self.p.nodes_of(cst.Assign):
            tgt = _code(node.targets[0].target).replace(" ", "")
            if "param_groups" in tgt and ('["lr"]' in tgt or "['lr']" in tgt):
                a.warn(f"custom learning-rate anneal at {self.loc(self.p.line(node))} (param_groups lr assignment) "
                       "is not supported; MegatronTrainer uses a constant LR")
        if not found_actor:
            found_actor = self.deepspeed_config()
        if not found_actor and not trl:
            a.warn("no optimizer construction was found; optim.actor.lr is left out")
        if found_actor and not trl:
            self.no_clipping_default()  # values.py

    def optimizer_alias(self, call, scope):
        """``Opt = DeepSpeedCPUAdam if args.offload else FusedAdam; Opt(params, lr=...)``: the optimizer
        class a variable holds (the branch the condition takes when known, else the first optimizer
        branch) as ``(last name, qualified names)``; None when the callee is not such a variable."""
        if not isinstance(call.func, cst.Name) or call.func.value in OPTIMIZERS:
            return None
        exprs = [e for e in self.p.assignments_of(call.func.value, scope) if e is not None]
        if len(exprs) != 1:
            return None
        e = exprs[0]
        branches = [e]
        if isinstance(e, cst.IfExp):
            test = self.p.ev(e.test, scope)
            branches = [e.body, e.orelse]
            if isinstance(test, Known) and not isinstance(test.value, Record):
                branches = [e.body] if test.value else [e.orelse]
        for b in branches:
            if isinstance(b, (cst.Name, cst.Attribute)) and (_last(b) or "") in OPTIMIZERS:
                return _last(b), self.qn(b)
        return None

    def _params_code(self, params, scope) -> str:
        """The parameters' expression and, for a variable, what it was built from (``optim_params =
        group_params(critic_model, ...)``): where the actor / critic role shows."""
        code = _code(params)
        if isinstance(params, cst.Name):
            exprs = [e for e in self.p.assignments_of(params.value, scope) if e is not None]
            if len(exprs) == 1:
                code += " " + _code(exprs[0])
        return code

    # torch.optim's defaults (torch/optim/adam.py, adamw.py): what an optimizer built without the keyword uses
    TORCH_OPTIM_DEFAULTS = {"Adam": {"weight_decay": 0.0, "eps": 1e-8, "betas": [0.9, 0.999]},
                            "AdamW": {"weight_decay": 0.01, "eps": 1e-8, "betas": [0.9, 0.999]}}

    def optimizer_defaults(self, call, scope, last: str, qs: set, wd) -> None:
        """eps / betas given to the actor's optimizer, and torch's default weight decay when it is not
        given (``torch.optim.AdamW(params, lr)`` decays by 0.01, ``Adam`` by 0)."""
        for kw, key in (("eps", "optim.actor.eps"), ("betas", "optim.actor.betas")):
            v = _kwarg(call, kw)
            if v is None:
                continue
            ev = self.p.ev(v, scope)
            if isinstance(ev, Known) and isinstance(ev.value, tuple):
                ev = Known(list(ev.value), ev.line)
            self.emit(key, ev, kw)
        torch_opt = any(q in (f"torch.optim.{last}", f"torch.optim.{last.lower()}.{last}") or q == f"optim.{last}"
                        for q in qs)
        if wd is None and torch_opt and last in self.TORCH_OPTIM_DEFAULTS and not any(
                a.keyword is None and not a.star for a in call.args[3:]):
            d = self.TORCH_OPTIM_DEFAULTS[last]["weight_decay"]
            self.emit_default("optim.actor.weight_decay", d, f"torch.optim.{last} default: weight_decay={d}")

    def deepspeed_config(self) -> bool:
        """``deepspeed.initialize(config=ds_config, ...)`` with the optimizer in the DeepSpeed config dict:
        ``{"optimizer": {"params": {"lr": ...}}, "gradient_clipping": ..., "train_micro_batch_size_per_gpu": ...}``."""
        found = False
        for call, scope in self.calls:
            if "deepspeed.initialize" not in self.qn(call.func):
                continue
            arg = _kwarg(call, "config") or _kwarg(call, "config_params")
            rec = self.p.ev_record(arg, scope) if arg is not None else None
            if rec is None:
                continue

            def field(r, *path):
                ev = None
                for i, k in enumerate(path):
                    if r is None or k not in r.fields:
                        return None
                    ev = self.p.record_field(r, k, rec.line)
                    if i < len(path) - 1:
                        r = ev.value if isinstance(ev, Known) and isinstance(ev.value, Record) else None
                return ev

            lr = field(rec, "optimizer", "params", "lr")
            if lr is not None:
                self.emit("optim.actor.lr", lr, "the DeepSpeed optimizer lr")
                found = True
            for k in ("eps", "betas"):
                v = field(rec, "optimizer", "params", k)
                if isinstance(v, Known) and isinstance(v.value, tuple):
                    v = Known(list(v.value), v.line)
                if v is not None:
                    self.emit(f"optim.actor.{k}", v, f"the DeepSpeed optimizer {k}")
            wd = field(rec, "optimizer", "params", "weight_decay")
            if wd is not None:
                self.emit("optim.actor.weight_decay", wd, "the DeepSpeed optimizer weight_decay")
            clip = field(rec, "gradient_clipping")
            if clip is not None:
                self.emit("optim.actor.clip_grad", clip, "gradient_clipping")
            micro = field(rec, "train_micro_batch_size_per_gpu")
            if micro is not None:
                self.emit("algorithm.micro_batch_size", micro, "train_micro_batch_size_per_gpu")
            if field(rec, "scheduler") is not None:
                self.a.warn(f"{self.loc(self.p.line(call))}: the DeepSpeed config's LR scheduler is not supported; "
                            "MegatronTrainer uses a constant LR (with optim.actor.warmup_steps)")
        return found

    def check_lr_constants(self, lr_node, scope) -> None:
        """Warn when an LR-like constant exists but a different value reaches the optimizer."""
        if lr_node is None:
            return
        used = self.p.ev(lr_node, scope)
        if not isinstance(used, Known):
            return
        for name, exprs in list(self.p.module_assigns.items()):
            if not re.fullmatch(r"(actor_|policy_)?(lr|learning_rate)", name, re.I):
                continue
            if len(exprs) != 1 or exprs[0] is None:
                continue
            v = self.p.ev(exprs[0], None)
            if isinstance(v, Known) and isinstance(v.value, (int, float)) and v.value != used.value:
                self.a.warn(f"{name} = {v.value!r} is defined at {self.loc(v.line)} but the optimizer receives "
                            f"{used.value!r} ({self.loc(used.line)}); optim.actor.lr uses the value that reaches the optimizer")
        rec = self.p.args_record()
        for k in ("lr", "learning_rate", "actor_lr"):
            if k in rec.fields:
                v = self.p.record_field(rec, k, 0)
                if isinstance(v, Known) and isinstance(v.value, (int, float)) and v.value != used.value \
                        and "args" not in _code(lr_node):
                    self.a.warn(f"--{k.replace('_', '-')} defaults to {v.value!r} ({self.loc(v.line)}) but the optimizer "
                                f"receives {used.value!r} ({self.loc(used.line)}); optim.actor.lr uses the value that "
                                "reaches the optimizer")

    def extract_parallel(self) -> None:
        for call, scope in self.calls:
            if _last(call.func) == "initialize_model_parallel":
                tp = _call_arg(call, 0, "tensor_model_parallel_size")
                pp = _call_arg(call, 1, "pipeline_model_parallel_size")
                if tp is not None:
                    self.emit("trainer.args.tp_size", self.p.ev(tp, scope), "the tensor-parallel size")
                if pp is not None:
                    self.emit("trainer.args.pp_size", self.p.ev(pp, scope), "the pipeline-parallel size")
            if self.is_fwd_bwd(call):
                mbs = _kwarg(call, "micro_batch_size")
                if mbs is not None:
                    self.emit("algorithm.micro_batch_size", self.p.ev(mbs, scope), "the micro-batch size")
        rec = self.p.args_record()
        if self.p.args_record is not None and any(_last(c.func) == "initialize_megatron" for c, _ in self.calls):
            for k, key in (("tensor_model_parallel_size", "trainer.args.tp_size"),
                           ("pipeline_model_parallel_size", "trainer.args.pp_size")):
                if k in rec.fields and key not in self.a.config:
                    ev = self.p.record_field(rec, k, 0)
                    if isinstance(ev, Known):
                        self.emit(key, ev)

    def extract_save(self) -> None:
        for call, scope in self.calls:
            if _last(call.func) not in ("save_checkpoint", "save_model", "save_pretrained", "save"):
                continue
            if not any(n is call for n in walk(self.main_loop)) and not self._reached_from_loop(scope):
                continue
            for anc in self.p.ancestors(call):
                if isinstance(anc, cst.If):
                    m = _find_modulo(anc.test)
                    if m is not None:
                        self.emit("trainer.save_every", self.p.ev(m, scope), "the checkpoint interval")
                        return
                if anc is self.main_loop:
                    break

    def _reached_from_loop(self, scope) -> bool:
        if scope is None:
            return False
        return any(f.node is scope.node for f in self.callees_closure(self.main_loop))

    def extract_hooks(self, trl: bool) -> None:
        a = self.a
        mod = self.module_name
        defs = {stmt.name.value for stmt in self.p.module.body if isinstance(stmt, cst.FunctionDef)}
        provider = None
        if "model_provider" in defs:
            provider = "model_provider"
        else:
            for call, scope in self.calls:
                if _last(call.func) in ("get_model", "setup_model_and_optimizer") and call.args:
                    first = call.args[0].value
                    if isinstance(first, cst.Name) and first.value in defs:
                        provider = first.value
        if provider is not None:
            node = next(s for s in self.p.module.body if isinstance(s, cst.FunctionDef) and s.name.value == provider)
            self.emit("model.actor.args.model_provider", Known(f"{mod}:{provider}", self.p.line(node)))
        else:
            if not self.emit_actor_model():  # models.py: the actor's name, a hub id or a flag to fill
                a.refuse(f"{self.loc(self.p.line(self.main_loop))}: no model_provider() function and no static "
                         "model path (from_pretrained('<local dir>')) were found: the model is built inline; move "
                         "its construction into a top-level model_provider(pre_process=True, post_process=True) "
                         "and run migrate again")
        a.config.pop("_model_name", None)
        for hook in ("initialize_megatron", "load_checkpoint"):
            if hook in defs:
                node = next(s for s in self.p.module.body if isinstance(s, cst.FunctionDef) and s.name.value == hook)
                self.emit(f"model.actor.args.{hook}", Known(f"{mod}:{hook}", self.p.line(node)))
            elif hook in self.p.imports:
                a.warn(f"{hook} is imported from {self.p.imports[hook]}, not defined in this file; MegatronTrainer "
                       f"uses its own unless you set model.actor.args.{hook}")

    def _from_pretrained_path(self):
        for call, scope in self.calls:
            if _last(call.func) == "from_pretrained" and call.args:
                recv = _code(call.func.value) if isinstance(call.func, cst.Attribute) else ""
                if "Tokenizer" in recv:
                    continue
                v = self.p.ev(call.args[0].value, scope)
                if isinstance(v, Known) and isinstance(v.value, str):
                    return (v.value, v.line)
        return None

    def unsupported(self) -> None:
        a = self.a
        for node, _scope in self.p.nodes_of(cst.Call, cst.Assign):
            if isinstance(node, cst.Call):
                last = _last(node.func) or ""
                qs = self.qn(node.func)
                if re.search(r"(^|_)ema($|_)|Exponential|Averaged|moving_average", last, re.I) \
                        or any("swa_utils" in q for q in qs):
                    a.warn(f"EMA of the weights ({last}() at {self.loc(self.p.line(node))}) is not supported by MegatronTrainer")
            elif isinstance(node, cst.Assign) and isinstance(node.targets[0].target, cst.Attribute) and re.search(
                    r"ptx", node.targets[0].target.attr.value, re.I):
                a.warn(f"pretraining (ptx) loss mixing ({_code(node.targets[0].target)} at "
                       f"{self.loc(self.p.line(node))}) is not supported by MegatronTrainer; it is dropped")
            elif isinstance(node, (cst.Assign,)) and isinstance(node.targets[0].target, cst.Name):
                if re.search(r"(^|_)ema($|_)", node.targets[0].target.value, re.I):
                    a.warn(f"EMA of the weights ({node.targets[0].target.value} at {self.loc(self.p.line(node))}) "
                           "is not supported by MegatronTrainer")
                if re.search(r"ptx", node.targets[0].target.value, re.I):
                    a.warn(f"pretraining (ptx) loss mixing ({node.targets[0].target.value} at "
                           f"{self.loc(self.p.line(node))}) is not supported by MegatronTrainer; it is dropped")


_MISSING = object()

