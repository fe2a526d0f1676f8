"""``data.max_prompt_length``: the longest prompt the script's data preparation lets through.

Decided by what the code does to the prompt's token ids, never by a flag's name:

* ``tokenizer.encode(text)[: sampler()]`` with ``sampler = LengthSampler(lo, hi)`` (TRL): prompts are
  cut to at most ``hi - 1`` tokens (``LengthSampler`` draws from ``range(lo, hi)``);
* ``dataset.filter(lambda x: len(x["input_ids"]) < n)`` keeps prompts of at most ``n - 1`` tokens
  (``<= n``: ``n``);
* ``tokenizer(text, truncation=True, max_length=n)`` stored as a prompt's ``input_ids`` / ``query``
  cuts it to ``n`` tokens.

Only when exactly one such bound is found (several that disagree leave the key out, with a warning).
"""

from __future__ import annotations

import libcst as cst

from .._static import Known, walk
from .base import _call_arg, _code, _kwarg, _last

PROMPT_TEXT_RE = ("input_ids", "query", "prompt", "question", "encode")


class PromptsMixin:
    def extract_prompt_length(self) -> None:
        found = []  # (value, line, how)
        for call, scope in self.calls:
            last = _last(call.func) or ""
            if last == "filter" and call.args:
                got = self._filter_bound(call.args[0].value, scope)
                if got is not None:
                    found.append(got)
            elif last in ("tokenizer", "encode", "__call__", "batch_encode_plus", "encode_plus") or \
                    (isinstance(call.func, cst.Name) and ("tokenizer" in call.func.value.lower()
                                                          or self._is_tokenizer(call.func.value, scope))) or \
                    (_kwarg(call, "truncation") is not None and _kwarg(call, "max_length") is not None):
                # (a call taking truncation= and max_length= is a tokenizer call, whatever it is named)
                got = self._truncation_bound(call, scope)
                if got is not None:
                    found.append(got)
        for node, scope in self.p.nodes_of(cst.Subscript):
            got = self._sliced_by_sampler(node, scope)
            if got is not None:
                found.append(got)
        values = {v for v, _, _ in found}
        if len(values) == 1:
            v, line, how = found[0]
            self.emit("data.max_prompt_length", Known(v, line), how)
        elif len(values) > 1:
            self.a.warn("data.max_prompt_length is left out: the prompts are bounded in several places with "
                        "different lengths (" + ", ".join(f"{v} at {self.loc(ln)}" for v, ln, _ in found) + ")")

    def _is_tokenizer(self, name: str, scope) -> bool:
        exprs = [e for e in self.p.assignments_of(name, scope) if e is not None]
        return bool(exprs) and all(isinstance(e, cst.Call) and "Tokenizer" in _code(e.func) for e in exprs)

    def _sliced_by_sampler(self, node: cst.Subscript, scope):
        """``tokenizer.encode(text)[: input_size()]`` / ``[:text_size]`` with a TRL LengthSampler."""
        if len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Slice):
            return None
        sl = node.slice[0].slice
        if sl.lower is not None or sl.upper is None:
            return None
        if not any(w in _code(node.value) for w in PROMPT_TEXT_RE):
            return None
        upper = sl.upper
        if isinstance(upper, cst.Name):  # text_size = input_size()
            exprs = [e for e in self.p.assignments_of(upper.value, scope) if e is not None]
            if len(exprs) != 1:
                return None
            upper = exprs[0]
        if not (isinstance(upper, cst.Call) and not upper.args and isinstance(upper.func, cst.Name)):
            return None
        samplers = [e for e in self.p.assignments_of(upper.func.value, scope) if e is not None]
        if len(samplers) != 1 or not isinstance(samplers[0], cst.Call) or _last(samplers[0].func) != "LengthSampler":
            return None
        s = samplers[0]
        sscope = self.p.func_of(s)
        hi = self.p.ev(_call_arg(s, 1, "max_value"), sscope)
        if isinstance(hi, Known) and isinstance(hi.value, int) and not isinstance(hi.value, bool):
            return (hi.value - 1, hi.line, "the prompt LengthSampler's max_value")
        return None

    def _filter_bound(self, fn, scope):
        """``ds.filter(lambda x: len(x["input_ids"]) < n)``."""
        if not isinstance(fn, cst.Lambda):
            return None
        body = fn.body
        if not (isinstance(body, cst.Comparison) and len(body.comparisons) == 1):
            return None
        left = body.left
        if not (isinstance(left, cst.Call) and isinstance(left.func, cst.Name) and left.func.value == "len"
                and left.args and "input_ids" in _code(left.args[0].value)):
            return None
        op = body.comparisons[0].operator
        n = self.p.ev(body.comparisons[0].comparator, scope)
        if not (isinstance(n, Known) and isinstance(n.value, int) and not isinstance(n.value, bool)):
            return None
        if isinstance(op, cst.LessThan):
            return (n.value - 1, n.line, "the prompt-length filter")
        if isinstance(op, cst.LessThanEqual):
            return (n.value, n.line, "the prompt-length filter")
        return None

    def _truncation_bound(self, call: cst.Call, scope):
        """``tokenizer(prompt, truncation=True, max_length=n)`` whose ids become the prompt."""
        trunc = _kwarg(call, "truncation")
        ml = _kwarg(call, "max_length")
        if trunc is None or ml is None:
            return None
        t = self.p.ev(trunc, scope)
        if not (isinstance(t, Known) and t.value is True):
            return None
        # the tokenized text must be a prompt: used as input_ids / query, or named like a prompt
        parent = self.p.parents.get(call)
        target = ""
        if isinstance(parent, cst.Assign):
            target = _code(parent.targets[0].target)
        for anc in self.p.ancestors(call):  # {"query_token": tokenizer(...)["input_ids"]}
            if isinstance(anc, cst.DictElement):
                target += " " + _code(anc.key)
            if isinstance(anc, (cst.SimpleStatementLine, cst.FunctionDef)):
                break
        arg0 = _code(call.args[0].value) if call.args and call.args[0].keyword is None else ""
        if not any(w in (target + " " + arg0).lower() for w in ("query", "prompt", "question", "source")):
            return None
        n = self.p.ev(ml, scope)
        if isinstance(n, Known) and isinstance(n.value, int) and not isinstance(n.value, bool):
            return (n.value, n.line, "the prompt tokenizer's max_length")
        return None
