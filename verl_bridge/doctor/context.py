"""What every check reads: installed distributions, module locations and probe results."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import os

from . import env
from .dists import SUPPORTED_MCORE
from .probe import Probe, Step, StepResult

MCORE_FIX = f'pip install "megatron-core{SUPPORTED_MCORE}"'
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
    timeout: float = 60.0
    probes: dict[str, Probe] = field(default_factory=dict)
    cwd: str = field(default_factory=os.getcwd)

    @cached_property
    def path(self) -> list[str]:
        """sys.path of the user's ``python`` in the current directory (probes see the same)."""
        return env.user_sys_path(self.cwd)

    @cached_property
    def dists(self) -> env.DistIndex:
        return env.DistIndex(self.path)

    @cached_property
    def megatron(self) -> env.ModuleLoc:
        return self.top("megatron")

    def top(self, name: str) -> env.ModuleLoc:
        return env.find_top(name, self.path)

    def cwd_shadow(self, name: str) -> str | None:
        """The current directory, when it is what makes ``import name`` resolve where it does."""
        return env.cwd_shadow(self.top(name), self.path, self.cwd)

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
        training = self.megatron_sub("training") if self.megatron.found and self.megatron.namespace else None
        if training:
            probes.append(Probe("megatron-training", [Step("megatron.training", "megatron.training", data={
                "file": "m.__file__",
                "package": "hasattr(m, '__path__')",
                "get_args": "hasattr(importlib.import_module('megatron.training.global_vars'), 'get_args')",
            })]))
        vllm = self.top("vllm")
        if vllm.found:
            probes.append(Probe("vllm", [
                Step("torch", "torch"),
                Step("vllm", "vllm", data={"version": "getattr(m, '__version__', None)", "file": "m.__file__"}),
                Step("vllm ops", "vllm", kind="exec", code=VLLM_OPS, data={"ops": "getattr(m, '__doctor_ops__', None)"}),
                # vLLM lists these media packages; a build that does not match torch breaks
                # transformers' model classes (`operator torchvision::nms does not exist`)
                *[Step(name, name) for name in VLLM_MEDIA if self.top(name).found],
            ]))
        return probes


VLLM_MEDIA = ("torchvision", "torchaudio", "torchcodec")

# How vLLM itself loads its compiled ops differs by release and platform: vllm._C (<= 0.32,
# and the CPU builds, which pick _C / _C_AVX512 / _C_AVX2 by CPU), _C_stable_libtorch (CUDA
# builds from 0.33). The probe asks vLLM's platform to load them (``import_kernels``, which logs
# "Failed to import from vllm.X" instead of raising) and turns those log records into the error;
# without a platform (a CUDA build on a machine without a GPU) it imports the op module the
# package ships, preferring _C_stable_libtorch.
VLLM_OPS = r"""
import logging, os
import vllm
failures = []
class _Catch(logging.Handler):
    def emit(self, record):
        msg = record.getMessage()
        if "Failed to import" in msg:
            failures.append(msg)
logging.getLogger("vllm").addHandler(_Catch())
platform = None
try:
    from vllm.platforms import current_platform as platform
    kind = type(platform).__name__
except ImportError:
    kind = "none"
loaded = None
if platform is not None and kind != "UnspecifiedPlatform" and hasattr(platform, "import_kernels"):
    platform.import_kernels()
    if failures:
        raise ImportError(failures[0])
    loaded = kind + ".import_kernels()"
else:
    folder = os.path.dirname(vllm.__file__)
    names = sorted(os.listdir(folder))
    ops = [n.split(".")[0] for n in names if n.startswith(("_C.", "_C_stable_libtorch.")) and n.endswith(".so")]
    ops = sorted(set(ops), key=lambda n: n != "_C_stable_libtorch")
    if not ops:
        raise ImportError("vllm ships no compiled ops module (_C or _C_stable_libtorch) in " + folder)
    importlib.import_module("vllm." + ops[0])
    loaded = "vllm." + ops[0]
m = sys.modules["vllm"]
m.__doctor_ops__ = loaded
"""
