"""--explain on the failure classes seen in public issues of Megatron-LM, megatron-core, Transformer Engine, apex,
vLLM, verl, NeMo and Megatron-DeepSpeed. Each text is a short error in our own spelling (the exception line and the
frame that matters); the knowledge-base entry of each class cites the thread it comes from. Where the text cannot
tell the cause, the answer must be "not sure" (``confident=False``), never a wrong diagnosis."""

from __future__ import annotations

import pytest

from verl_bridge.doctor import dists
from verl_bridge.doctor.env import DistIndex
from verl_bridge.doctor.explain import Facts, explain


def _facts() -> Facts:
    return Facts(mcore_version="0.16.1", torch_version="2.13.0+cu128", torch_cuda="12.8", python="3.11", cwd="/nonexistent",
                 install=lambda mod: dists.install_fix(mod, DistIndex([]), "0.16.1"), owner=lambda path: None)


def best(text: str):
    m = explain(text, facts=_facts())
    assert m, text
    return m[0]


# (text, expected id, strings the fix must contain)
CASES = [
    # vLLM's memory budget: which knob
    ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
     "initializing the engine.", "vllm-kv-cache-blocks", ["raise gpu_memory_utilization", "rollout.gpu_memory_utilization"]),
    ("ValueError: The model's max seq len (8192) is larger than the maximum number of tokens that can be stored in KV "
     "cache (2000). Try increasing `gpu_memory_utilization` or decreasing `max_model_len`",
     "vllm-max-model-len", ["--max-model-len 2000"]),
    ("ValueError: To serve at least one request with the models's max seq len (32768), (4.0 GiB KV cache is needed, "
     "which is larger than the available KV cache memory (1.5 GiB). Based on the available memory, the estimated "
     "maximum model length is 12000. Try increasing `gpu_memory_utilization` or decreasing `max_model_len`",
     "vllm-max-model-len", ["--max-model-len 12000"]),
    ("ValueError: Free memory on device cuda:0 (30.0/80.0 GiB) on startup is less than desired GPU memory utilization "
     "(0.9, 72.0 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
     "vllm-free-memory", ["at most 0.37", "nvidia-smi"]),
    # vLLM on Windows
    ("  File \"C:\\Users\\me\\venv\\Lib\\site-packages\\vllm\\__init__.py\", line 3, in <module>\n"
     "ModuleNotFoundError: No module named 'vllm._C'", "vllm-windows", ["WSL2"]),
    # Megatron-LM layouts and forks
    ("ImportError: cannot import name 'validate_args' from 'megatron.arguments'", "megatron-lm-old-copy",
     ["import megatron.arguments as m; print(m.__file__)"]),
    ("ModuleNotFoundError: No module named 'megatron.data'", "megatron-legacy-layout", ["git submodule update --init"]),
    ("  File \"/src/Megatron-DeepSpeed/megatron/core/utils.py\", line 13, in <module>\n    from deepspeed import "
     "get_accelerator\nImportError: cannot import name 'get_accelerator' from 'deepspeed'",
     "megatron-deepspeed-needs-newer-deepspeed", ["pip install -U deepspeed"]),
    ("  File \"/ws/mlm/tools/preprocess_data.py\", line 23, in <module>\nModuleNotFoundError: No module named "
     "'megatron.training.tokenizer'; 'megatron.training' is not a package", None, []),
    ("  File \"/ws/Megatron-LM/tools/preprocess_data.py\", line 23, in <module>\nModuleNotFoundError: No module named "
     "'megatron'", "megatron-tools-pythonpath", ["export PYTHONPATH=/ws/Megatron-LM:$PYTHONPATH"]),
    # megatron-core names and enum members
    ("AttributeError: type object 'ModelType' has no attribute 'encoder_and_decoder'", "megatron-modeltype-removed",
     ["getattr(ModelType, \"encoder_and_decoder\", None)", "<0.14"]),
    # NCCL NVLS
    ("NCCL WARN Failed to bind NVLink SHARP (NVLS) Multicast memory of size 2097152 : CUDA error 401",
     "nccl-nvls", ["NCCL_NVLS_ENABLE=0"]),
    ("x:1:2 [0] transport/nvls.cc:598 NCCL WARN Cuda failure 1 'invalid argument'", "nccl-nvls", ["NCCL_NVLS_ENABLE=0"]),
    # apex, Transformer Engine
    ("ImportError: cannot import name 'amp' from 'apex' (/venv/lib/python3.10/site-packages/apex/__init__.py)",
     "apex-amp-removed", ["torch.amp.GradScaler"]),
    ("ImportError: cannot import name 'load_framework_extension' from 'transformer_engine.common' (unknown location)",
     "transformer-engine-partial", ["pip uninstall -y transformer-engine"]),
    ("ImportError: cannot import name 'check_set_window_size' from 'transformer_engine.pytorch.attention'",
     "transformer-engine-api", ["pip show transformer-engine"]),
    ("ImportError: Using `has_transformer_engine_layers` requires transformer_engine to be installed.",
     "te-fp8-missing", ["transformer-engine[pytorch]"]),
    # libstdc++: which copy was loaded decides the fix
    ("ImportError: /opt/conda/envs/rl/lib/libstdc++.so.6: version `GLIBCXX_3.4.30' not found (required by "
     "/opt/conda/envs/rl/lib/python3.11/site-packages/x/_ext.so)", "torch-libstdcxx-conda",
     ["conda install -p /opt/conda/envs/rl -c conda-forge 'libstdcxx-ng>=12'"]),
    ("ImportError: /usr/lib/x86_64-linux-gnu/libstdc++.so.6: version `GLIBCXX_3.4.30' not found", "torch-libstdcxx",
     ["LD_LIBRARY_PATH=$CONDA_PREFIX/lib"]),
]


@pytest.mark.parametrize("text,expected,fix_has", CASES)
def test_class(text, expected, fix_has):
    m = best(text)
    if expected is None:  # the checkout root is not named in the text: only the tools/ rule may not guess one
        assert "PYTHONPATH=/ws/mlm" not in m.fix
        return
    assert m.id == expected, (m.id, m.cause)
    assert m.confident, m.cause
    for s in fix_has:
        assert s in m.fix, (s, m.fix)


def test_high_gpu_memory_utilization_says_the_model_does_not_fit():
    m = best("--gpu-memory-utilization 0.95\nValueError: No available memory for the cache blocks. Try increasing "
             "`gpu_memory_utilization` when initializing the engine.")
    assert m.id == "vllm-kv-cache-blocks" and "already 0.95" in m.cause
    assert "tensor_parallel_size" in m.fix and "raise gpu_memory_utilization" not in m.fix


@pytest.mark.parametrize("text", [
    "ImportError: cannot import name 'DeepseekV2Config' from 'transformers' (/v/site-packages/transformers/__init__.py)",
    "ImportError: cannot import name 'get_vllm_engine' from 'swift.llm'",
    "cannot import name 'amp' from 'apex' (unknown location)",
])
def test_foreign_import_names_are_not_guessed(text):
    m = best(text)
    assert m.id == "import-name-not-sure" and not m.confident
    assert m.fix.startswith("pip check")


def test_libstdcxx_without_a_path_is_not_sure():
    m = best("OSError: version `GLIBCXX_3.4.29' not found (required by /x/site-packages/y/_z.so)")
    assert m.id == "torch-libstdcxx" and not m.confident and "ldd /x/site-packages/y/_z.so" in m.fix


def test_vllm_ops_missing_in_a_checkout_on_linux_is_not_windows():
    m = best("python examples/offline_inference/basic/basic.py\nModuleNotFoundError: No module named 'vllm._C'")
    assert m.id == "vllm-no-ops"


def test_megatron_deepspeed_is_named_as_the_fork():
    m = best("  File \"/w/Megatron-DeepSpeed/megatron/training.py\", line 99, in pretrain\nRuntimeError: boom")
    assert m.id == "megatron-deepspeed" and not m.confident and "Megatron-DeepSpeed" in m.cause


def test_legacy_megatron_model_names_the_new_place():
    m = best("ModuleNotFoundError: No module named 'megatron.model'")
    assert m.id == "megatron-training-missing" and "megatron.legacy.model" in m.cause and "core_r0.5.0" in m.fix


def test_every_new_class_cites_a_public_thread():
    from verl_bridge.doctor import knowledge

    ids = {c[1] for c in CASES if c[1]}
    by_id = {s.id: s for s in knowledge.SIGNATURES}
    for i in ids:
        assert by_id[i].source.startswith("https://github.com/"), i


def test_flash_attn_without_its_extension_is_rebuilt_not_installed_again():
    # https://github.com/Dao-AILab/flash-attention/issues/614: the package is there, its compiled part is not
    m = best("  File \"/v/site-packages/flash_attn/flash_attn_interface.py\", line 8, in <module>\n"
             "ModuleNotFoundError: No module named 'flash_attn_2_cuda'")
    assert m.id == "flash-attn-no-ext" and "--no-build-isolation" in m.fix and m.fix.startswith("pip uninstall -y flash-attn")


def test_megatron_core_submodule_missing_without_an_installed_wheel_names_the_copy():
    # https://github.com/verl-project/verl/issues/573: an old Megatron-LM checkout on PYTHONPATH
    f = _facts()
    f.mcore_version = None
    m = explain("ModuleNotFoundError: No module named 'megatron.core.optimizer'", facts=f)[0]
    assert m.id == "megatron-core-version" and "checkout" in m.cause
    assert m.fix.startswith('python -c "import megatron.core as m; print(m.__file__)"')
    assert 'pip install "megatron-core>=0.12,<0.20"' in m.fix
    api = explain("ImportError: cannot import name 'DistributedDataParallelConfig' from 'megatron.core.distributed'",
                  facts=f)[0]
    assert api.id == "megatron-core-api" and "==0.8.0" not in api.fix and "the installed megatron-core" not in api.cause


def test_old_megatron_api_from_a_package_needs_the_old_layout_not_an_edit():
    # https://github.com/huggingface/accelerate/issues/2390: accelerate's own `from megatron import get_args`
    m = best("  File \"/usr/lib/python3.10/site-packages/accelerate/utils/megatron_lm.py\", line 42, in <module>\n"
             "ImportError: cannot import name 'get_args' from 'megatron' (unknown location)")
    assert m.id == "megatron-training" and "git clone -b core_r0.5.0" in m.fix
    t = best("ImportError: cannot import name 'get_timers' from 'megatron.training'")
    assert t.id == "megatron-lm-old-copy" and "pre-2024" not in t.cause


def test_vllm_ops_missing_on_macos_and_when_the_text_cannot_tell():
    mac = best("  File \"/Users/me/venv/lib/python3.12/site-packages/vllm/_custom_ops.py\", line 18\n"
               "ModuleNotFoundError: No module named 'vllm._C'")
    assert mac.id == "vllm-macos" and mac.confident and "source" in mac.fix
    # a bare message (https://github.com/microsoft/fara/issues/33): checkout, platform or broken install
    bare = best("ModuleNotFoundError: No module named 'vllm._C'")
    assert bare.id == "vllm-no-ops" and not bare.confident and bare.fix.startswith('python -c "import vllm')


def test_libstdcxx_with_an_elided_path_is_not_called_the_system_one():
    m = best("ImportError: …/libstdc++.so.6: version `GLIBCXX_3.4.32' not found (required by …/gymtorch.so)")
    assert m.id == "torch-libstdcxx" and not m.confident and "system libstdc++ (" not in m.cause
    system = best("ImportError: /lib64/libstdc++.so.6: version `GLIBCXX_3.4.20' not found")
    assert system.confident and "libstdc++.so.6*" in system.fix


def test_from_megatron_import_get_args_without_a_location_is_not_sure():
    # too new (moved to megatron.training) or too old (Megatron-LM 1.1, https://github.com/laekov/fastmoe/issues/181)
    m = best("ImportError: cannot import name 'get_args' from 'megatron'")
    assert m.id == "megatron-training-legacy-api" and not m.confident and "1.x" in m.cause


def test_fp8_needing_a_newer_te_is_not_called_missing_te():
    m = explain("RuntimeError: FP8 dequantization requires Transformer Engine >= 2.7.0.dev0", facts=_facts())
    assert not m or m[0].id != "te-fp8-missing"


def test_nccl_unhandled_cuda_error_with_nvls_info_lines_is_not_called_nvls():
    # https://github.com/vllm-project/vllm/issues/6732: INFO lines name NVLS, nothing says it failed
    m = best("x:1:2 [5] NCCL INFO NVLS multicast support is available on dev 5\n"
             "[rank0]: RuntimeError: NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details)")
    assert m.id == "nccl-error" and not m.confident and "NCCL_DEBUG=INFO" in m.fix


def test_vllm_memory_knob_is_read_from_a_verl_command_line():
    # https://github.com/verl-project/verl/issues/2245: the knob is verl's actor_rollout_ref.rollout.gpu_memory_utilization
    m = best("python3 -m verl.trainer.main_ppo actor_rollout_ref.rollout.gpu_memory_utilization=0.3\n"
             "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
             "initializing the engine.")
    assert "is 0.3 here" in m.cause and "actor_rollout_ref.rollout.gpu_memory_utilization" in m.fix
