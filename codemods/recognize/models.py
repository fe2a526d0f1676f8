"""Which model is the actor, and where its name comes from.

The actor is the causal LM the loop trains: built by ``X.from_pretrained(name)`` where X is a
causal-LM class (``AutoModelForCausalLM``, ``LlamaForCausalLM``, TRL's value-head wrapper
``AutoModelForCausalLMWithValueHead`` - also when it wraps an already loaded model), by vLLM's
``LLM(model=name)``, or named by a legacy TRL ``PPOConfig(model_name=...)``. Never a reward or
sequence classifier, a tokenizer, a config, a ``pipeline(...)`` or a frozen reference copy.

The name is resolved like any value (a literal, a constant, a CLI flag's default, a dataclass
field's default). A hub id migrates as it is (``model.actor.args.model_name_or_path``); a flag the
command line must supply (no default, ``None`` or ``""``) goes to ``to_fill`` with the flag's name.
"""

from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from .._static import Known, Record, Runtime, dotted
from .base import _call_arg, _code, _kwarg, _last

CAUSAL_LM_RE = re.compile(r"(ForCausalLM|CausalLMWithValueHead|Seq2SeqLMWithValueHead|ForConditionalGeneration|"
                          r"LMHeadModel|CausalLMWithScalarHead|ScalarHead)\w*$")
NOT_ACTOR_RE = re.compile(r"SequenceClassification|TokenClassification|Tokenizer|Config$|Processor|Reward|Critic|"
                          r"ValueModel|ScalarModel", re.I)
NOT_ACTOR_TARGET_RE = re.compile(r"(^|_)(ref|reference|reward|rm|critic|value|classifier|cls|judge|sentiment|"
                                 r"toxicity|scorer|teacher|frozen|base_ref)(_|$)|^rm\d*$", re.I)


class ModelsMixin:
    # ------------------------------------------------------------------ the actor
    def actor_model(self):
        """``(name, line)`` of the actor's model, or ``("<to_fill>", flag, line)`` when the command line
        must give it, or None when no model name is found."""
        cands = []
        for call, scope in self.calls:
            got = self._model_site(call, scope)
            if got is not None:
                cands.append(got)
        if not cands:
            return None
        # the site whose result is the trained model first: a name used by the optimizer / trainer,
        # then any causal LM that is not a reference / reward / critic
        cands.sort(key=lambda c: (c[3], c[4]))
        return cands[0][:3]

    def _param_sites(self, scope, name: str):
        """``(argument, caller scope, call)`` at every call of *scope*'s function for its parameter *name*
        (a helper such as ``create_hf_model(model_class, model_name_or_path)`` called once per role)."""
        if scope is None or name not in scope.params:
            return []
        idx, param = scope.params[name]
        out = []
        for site, caller, offset in self.p.calls_by_callee().get(scope.qual, []):
            arg = self.p._arg_for(site, idx, name, offset)
            if arg == "star":
                continue
            if arg is None:
                arg, caller = param.default, scope.parent
            if arg is not None:
                out.append((arg, caller, site))
        return out

    def _model_site_via_params(self, call: cst.Call, scope):
        """``model_class.from_pretrained(model_name_or_path)`` inside a helper whose class (and maybe
        name) are its parameters: the call sites that pass a causal-LM class, each read as a model
        site of its own (the role is the name the site's result is assigned to)."""
        cls_node = call.func.value
        if not (isinstance(cls_node, cst.Name) and scope is not None and cls_node.value in scope.params):
            return None
        name_node = _call_arg(call, 0, "pretrained_model_name_or_path")
        best = None
        for arg, caller, site in self._param_sites(scope, cls_node.value):
            q = next(iter(sorted(self.qn(arg))), dotted(arg) or "")
            clsname = q.rsplit(".", 1)[-1]
            if not clsname or NOT_ACTOR_RE.search(clsname) or not CAUSAL_LM_RE.search(clsname):
                continue
            target = self._assigned_name(site)
            if target is not None and NOT_ACTOR_TARGET_RE.search(target):
                continue
            name_arg, name_scope = name_node, scope
            if isinstance(name_node, cst.Name) and name_node.value in scope.params:
                bound = [(a, c) for a, c, s in self._param_sites(scope, name_node.value) if s is site]
                if not bound:
                    continue
                name_arg, name_scope = bound[0]
            rank = 0 if target is not None and self._trained(target) else 1
            line = self.p.line(site)
            ev = self.p.ev(name_arg, name_scope)
            got = None
            if isinstance(ev, Known) and isinstance(ev.value, str) and ev.value.strip():
                got = (ev.value, ev.line, None, rank, line)
            elif isinstance(ev, Runtime) or (isinstance(ev, Known) and ev.value in (None, "")):
                flag = self.flag_of(name_arg, name_scope)
                if flag is not None:
                    got = ("<to_fill>", ev.line if ev.line else line, flag, rank, line)
            if got is not None and (best is None or got[3:] < best[3:]):
                best = got
        return best

    def _model_site(self, call: cst.Call, scope):
        last = _last(call.func) or ""
        if last == "from_pretrained" and call.args and isinstance(call.func, cst.Attribute):
            via = self._model_site_via_params(call, scope)
            if via is not None:
                return via
            cls = dotted(call.func.value) or ""
            q = next(iter(sorted(self.qn(call.func.value))), cls)
            clsname = q.rsplit(".", 1)[-1]
            if NOT_ACTOR_RE.search(clsname) or not CAUSAL_LM_RE.search(clsname):
                return None
            arg = _call_arg(call, 0, "pretrained_model_name_or_path")
        elif last == "LLM" and any(q.startswith("vllm") for q in self.qn(call.func)):
            arg = _call_arg(call, 0, "model")
        else:
            return None
        if arg is None:
            return None
        target = self._assigned_name(call)
        if target is not None and NOT_ACTOR_TARGET_RE.search(target):
            return None
        # a value-head wrapper of an already loaded model: the wrapped model's name
        if isinstance(arg, cst.Name):
            inner = [e for e in self.p.assignments_of(arg.value, scope) if isinstance(e, cst.Call) and e is not call]
            if inner and all(_last(e.func) == "from_pretrained" for e in inner):
                subs = [self._model_site(e, scope) for e in inner]
                subs = [s for s in subs if s is not None]
                if subs:
                    s = subs[0]
                    return (s[0], s[1], s[2], 0 if target and self._trained(target) else 1, self.p.line(call))
                return None
        line = self.p.line(call)
        ev = self.p.ev(arg, scope)
        rank = 0 if target is not None and self._trained(target) else 1
        if isinstance(ev, Known) and isinstance(ev.value, str) and ev.value.strip():
            return (ev.value, ev.line, None, rank, line)
        if isinstance(ev, Runtime) or (isinstance(ev, Known) and ev.value in (None, "")):
            flag = self.flag_of(arg, scope)
            if flag is not None:
                return ("<to_fill>", ev.line if ev.line else line, flag, rank, line)
        return None

    def _any_pretrained(self):
        """Fallback: the first ``X.from_pretrained("<literal>")`` of a model class that is not a
        tokenizer, config, classifier or reward / reference / critic model."""
        for call, scope in self.calls:
            if _last(call.func) != "from_pretrained" or not call.args or not isinstance(call.func, cst.Attribute):
                continue
            q = next(iter(sorted(self.qn(call.func.value))), dotted(call.func.value) or "")
            if NOT_ACTOR_RE.search(q.rsplit(".", 1)[-1]) or "Tokenizer" in _code(call.func.value):
                continue
            target = self._assigned_name(call)
            if target is not None and NOT_ACTOR_TARGET_RE.search(target):
                continue
            v = self.p.ev(call.args[0].value, scope)
            if isinstance(v, Known) and isinstance(v.value, str) and v.value.strip():
                return (v.value, v.line, None)
        return None

    def _assigned_name(self, call) -> Optional[str]:
        parent = self.p.parents.get(call)
        if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
            t = parent.targets[0].target
            if isinstance(t, cst.Name):
                return t.value
            if isinstance(t, cst.Attribute):
                return t.attr.value
        return None

    def _trained(self, name: str) -> bool:
        """*name* is handed to an optimizer, a trainer or ``.train()``/``.backward`` code."""
        for call, _scope in self.calls:
            last = _last(call.func) or ""
            if last in ("PPOTrainer", "Adam", "AdamW", "SGD", "initialize", "prepare", "get_peft_model",
                        "GRPO", "Trainer") or last.endswith("Trainer"):
                for a in call.args:
                    if name in re.findall(r"\w+", _code(a.value)):
                        return True
        return False

    # ------------------------------------------------------------------ command-line flags
    def flag_of(self, node, scope) -> Optional[str]:
        """``--name`` of the command-line flag / dataclass field an expression reads, through configs
        built from it (``PPOConfig(model_name=script_args.model_name)`` -> ``--model_name``)."""
        for _ in range(6):
            if isinstance(node, cst.Attribute):
                rec = self.p.ev_record(node.value, scope)
                if rec is None:
                    return None
                val = rec.fields.get(node.attr.value)
                if rec.kind == "args" or rec.kind.startswith("dataclass:"):
                    return f"--{node.attr.value}"
                if isinstance(val, tuple):
                    node, scope = val
                    continue
                return None
            if isinstance(node, cst.Name):
                if scope is not None and node.value in scope.params and node.value not in scope.assigns:
                    # a parameter: the flag every call site passes for it
                    flags = {self.flag_of(a, c) for a, c, _ in self._param_sites(scope, node.value)}
                    return flags.pop() if len(flags) == 1 else None
                exprs = [e for e in self.p.assignments_of(node.value, scope) if e is not None]
                if len(exprs) != 1:
                    return None
                node = exprs[0]
                continue
            return None
        return None

    def emit_actor_model(self) -> bool:
        """Put the actor's model into the config (or ``to_fill``); False when none is found."""
        a = self.a
        site = a.config.pop("_model_name", None)
        found = self.actor_model()
        if found is None and site is not None:
            found = (site[0], site[1], None)
        if found is None:
            found = self._any_pretrained()
        if found is None:
            return False
        name, line, flag = found
        if name == "<to_fill>":
            self.to_fill("model.actor.args.model_name_or_path", flag, line)
            return True
        self.emit("model.actor.args.model_name_or_path", Known(name, line))
        if not name.startswith(("/", ".")):
            a.warn(f"model.actor.args.model_name_or_path={name!r} looks like a Hub id; the config keeps it as "
                   "it is (the trainer resolves hub ids; a local Hugging Face directory works too)")
        return True

    def to_fill(self, key: str, flag: str, line) -> None:
        """A value the command line must supply: written as a placeholder, listed under ``to_fill``."""
        self.a.to_fill[key] = {"flag": flag, "from": self.loc(line),
                               "placeholder": f"<fill: {flag}>"}
        self.a.warn(f"{key} comes from the command line ({flag}, {self.loc(line)}) with no default; the YAML "
                    f"has the placeholder '<fill: {flag}>' (`verl-bridge validate` names it): set it before training")
