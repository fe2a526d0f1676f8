"""What every check reads: installed distributions, module locations and probe results."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from . import env
from .probe import Probe, Step, StepResult

SUPPORTED_MCORE = ">=0.12,<0.20"
MCORE_FIX = 'pip install "megatron-core>=0.12,<0.20"'
TORCH_DATA = {
    "version": "m.__version__",
    "cuda": "m.version.cuda",
    "file": "m.__file__",
    "cxx11abi": "bool(m._C._GLIBCXX_USE_CXX11_ABI)",
    "nccl": "(lambda v: '.'.join(map(str, v)) if isinstance(v, tuple) else str(v))(m.cuda.nccl.version()) if m.version.cuda else None",
}
APEX_EXTENSIONS = ("amp_C", "fused_layer_norm_cuda", "fused_weight_gradient_mlp_cuda", "apex_C")


@dataclass
class Context:
    config_path: str | None = None
    timeout: float = 4.0
    probes: dict[str, Probe] = field(default_factory=dict)

    @cached_property
    def dists(self) -> env.DistIndex:
        return env.DistIndex()

    @cached_property
    def megatron(self) -> env.ModuleLoc:
        return env.find_top("megatron")

    def top(self, name: str) -> env.ModuleLoc:
        return env.find_top(name)

    def megatron_sub(self, dotted: str) -> str | None:
        """File or directory of ``megatron.<dotted>`` as Python would resolve it, or None."""
        loc = self.megatron
        if not loc.found:
            return None
        if loc.namespace:
            return env.find_sub(loc.locations, dotted)
        return env.find_sub(loc.locations, dotted) if loc.locations else None

    def step(self, probe: str, step: str) -> StepResult | None:
        p = self.probes.get(probe)
        return p.get(step) if p else None

    # -- probes -------------------------------------------------------------------------
    def plan_probes(self) -> list[Probe]:
        probes: list[Probe] = []
        torch_step = Step("torch", "torch", data=TORCH_DATA)
        if self.top("torch").found:
            probes.append(Probe("torch", [torch_step]))
        if self.megatron.found and self.megatron_sub("core"):
            probes.append(Probe("megatron-core", [Step("megatron.core", "megatron.core", data={
                "file": "m.__file__",
                "version": "importlib.import_module('megatron.core.package_info').__version__",
            })]))
        if self.top("transformer_engine").found:
            probes.append(Probe("transformer-engine", [
                Step("torch", "torch"),
                Step("transformer_engine", "transformer_engine", data={"version": "getattr(m, '__version__', None)"}),
                Step("transformer_engine.pytorch", "transformer_engine.pytorch"),
            ]))
        fa_ext = self.top("flash_attn_2_cuda")
        if fa_ext.found or self.top("flash_attn").found:
            steps = [Step("torch", "torch")]
            if fa_ext.found:
                steps.append(Step("flash_attn_2_cuda", "flash_attn_2_cuda"))
            steps.append(Step("flash_attn", "flash_attn", data={"version": "getattr(m, '__version__', None)"}))
            probes.append(Probe("flash-attn", steps))
        if self.top("apex").found:
            steps = [Step("torch", "torch")]
            steps += [Step(ext, ext) for ext in APEX_EXTENSIONS if self.top(ext).found]
            probes.append(Probe("apex", steps))
        vllm = self.top("vllm")
        if vllm.found:
            steps = [Step("torch", "torch")]
            c_file = env.find_sub(vllm.locations, "_C") if vllm.locations else None
            if c_file and not c_file.endswith(("/_C", "\\_C")):
                steps.append(Step("vllm._C", "vllm._C", kind="load", path=c_file))
            else:
                steps.append(Step("vllm._C", "vllm._C"))
            probes.append(Probe("vllm", steps))
        return probes
