"""Warnings for what changes silently when the loop becomes a MegatronTrainer config: adapters and
quantisation (LoRA, 4/8-bit), frozen or shared layers, reward whitening or normalisation. Each names the
line; none changes a value of the config."""

from __future__ import annotations

import re

import libcst as cst

from .._static import walk
from .base import _code, _kwarg, _last

ADAPTER_CALLS = {"get_peft_model", "LoraConfig", "prepare_model_for_kbit_training", "prepare_model_for_int8_training",
                 "BitsAndBytesConfig", "PeftModel", "AdaLoraConfig", "IA3Config"}
QUANT_KWARGS = ("load_in_8bit", "load_in_4bit", "quantization_config")
REWARD_NAME_RE = re.compile(r"reward|score", re.I)


class SemanticsMixin:
    def warn_semantics(self) -> None:
        a = self.a
        adapters = quant = None
        for call, scope in self.calls:
            last = _last(call.func) or ""
            if adapters is None and (last in ADAPTER_CALLS - {"BitsAndBytesConfig"} or _kwarg(call, "peft_config") is not None):
                adapters = call
            if quant is None and (last == "BitsAndBytesConfig" or any(
                    _kwarg(call, k) is not None and _code(_kwarg(call, k)) not in ("False", "None") for k in QUANT_KWARGS)):
                quant = call
            if last == "create_reference_model" and _kwarg(call, "num_shared_layers") is not None:
                a.warn(f"{self.loc(self.p.line(call))}: create_reference_model(..., num_shared_layers="
                       f"{_code(_kwarg(call, 'num_shared_layers'))}) shares and freezes the bottom layers of the policy: "
                       "only the top layers train in the script; MegatronTrainer trains every layer of the actor")
            if last in ("whiten", "masked_whiten", "normalize", "normalise") and call.args and \
                    REWARD_NAME_RE.search(_code(call.args[0].value)):
                a.warn(f"{self.loc(self.p.line(call))}: the rewards are whitened/normalised (`{_code(call)[:70]}`) "
                       "before the advantages; MegatronTrainer uses the rewards as returned, so the reward scale "
                       "changes; normalise inside the reward function if it matters")
        for node, scope in self.p.nodes_of(cst.Assign):
            for t in node.targets:
                tg = t.target
                if isinstance(tg, cst.Attribute) and tg.attr.value == "requires_grad" and _code(node.value) == "False":
                    loop = next((x for x in self.p.ancestors(node) if isinstance(x, cst.For)), None)
                    if loop is not None and re.search(r"param", _code(loop.iter)) and \
                            not REF_LIKE.search(_code(loop.iter)):
                        a.warn(f"{self.loc(self.p.line(node))}: parameters of a model are frozen "
                               f"(`{_code(loop.iter)[:60]}`); MegatronTrainer trains every parameter of the actor "
                               "unless the model provider freezes them")
                        break
        if adapters is not None:
            a.warn(f"{self.loc(self.p.line(adapters))}: the policy is trained through LoRA/PEFT adapters "
                   f"(`{_code(adapters.func)}`); MegatronTrainer trains the full weights, so memory use and the "
                   "effective learning rate change; the adapter settings are not migrated")
        if quant is not None:
            a.warn(f"{self.loc(self.p.line(quant))}: the model is loaded quantised (4-bit/8-bit: "
                   f"`{_code(quant)[:70]}`); MegatronTrainer loads it in the configured precision")


REF_LIKE = re.compile(r"ref|reference|reward|critic|value|frozen", re.I)
