"""--explain against real error texts (taken from the issue threads the knowledge base cites)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from verl_bridge.doctor import knowledge
from verl_bridge.doctor.explain import Facts, explain

from .fakeenv import FakeEnv

CASES = [
    ("cannot import name 'get_args' from 'megatron' (unknown location)", "megatron-training"),
    ("ImportError: cannot import name 'get_args' from 'megatron' "
     "(/opt/conda/lib/python3.8/site-packages/megatron/__init__.py)", "megatron-namespace"),
    ("ImportError: /opt/lib/python3.12/site-packages/flash_attn_2_cuda.cpython-312-x86_64-linux-gnu.so: undefined "
     "symbol: _ZN3c105ErrorC2ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE", "flash-attn-abi"),
    ("ImportError: /usr/local/lib/python3.10/dist-packages/transformer_engine/transformer_engine_torch.cpython-310-"
     "x86_64-linux-gnu.so: undefined symbol: _ZN3c105ErrorC2ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_"
     "traitsIcESaIcEEE", "transformer-engine-abi"),
    ("ImportError: /workspace/vllm/_C.abi3.so: undefined symbol: _ZN5torch3jit17parseSchemaOrNameERKSsb", "vllm-abi"),
    ("ERROR: pip's dependency resolver ...\nvllm 0.7.3 requires torch==2.5.1, but you have torch 2.4.0+cu124 "
     "which is incompatible.", "vllm-torch-pin"),
    ("ImportError: /home/u/.local/lib/python3.10/site-packages/torch/lib/libtorch_cuda.so: undefined symbol: "
     "ncclCommRegister", "nccl-duplicate"),
    ("ModuleNotFoundError: No module named 'amp_C'", "apex-no-cuda-ext"),
    ("ValueError: Supported flash-attn versions are >= 2.1.1, <= 2.7.4.post1. Found flash-attn 2.8.3.", "flash-attn-window"),
    ("from megatron.optimizer import DistributedOptimizer\nModuleNotFoundError: No module named 'megatron.optimizer'",
     "megatron-training-missing"),
    ("ImportError: cannot import name 'get_data_modulo_expert_parallel_rank' from 'megatron.core.parallel_state' "
     "(/x/megatron/core/parallel_state.py)", "megatron-core-api"),
    ("  File \".../transformer_engine/pytorch/__init__.py\", line 52, in _load_library\n"
     "    so_path = next(so_dir.glob(f\"{module_name}.*.{extension}\"))\nStopIteration", "transformer-engine-partial"),
    ("RuntimeError: The NVIDIA driver on your system is too old (found version 11040).", "torch-driver"),
    ("ImportError: /usr/lib/x86_64-linux-gnu/libstdc++.so.6: version `GLIBCXX_3.4.30' not found", "torch-libstdcxx"),
    ("from verl.trainer.rl_trainer.megatron import MegatronTrainer\nModuleNotFoundError: No module named 'verl'",
     "verl-bridge-import-path"),
    ("[rank2]:     model = GPTModel(\nTypeError: TransformerLayer.__init__() got an unexpected keyword argument "
     "'apply_query_key_layer_scaling'", "api-drift-keyword"),
    ("ImportError: libcuda.so.1: cannot open shared object file: No such file or directory", "cuda-driver-missing"),
    ("/sbin/ldconfig.real: /usr/local/cuda/lib64/libcudnn.so.5 is not a symbolic link", "cudnn-ldconfig"),
    ("Could not load library libcudnn_cnn_infer.so.8. Error: libcuda.so: cannot open shared object file",
     "cuda-driver-missing"),
    ("Could not load library libcudnn_ops_infer.so.8. Error: libcudnn_ops_infer.so.8: cannot open shared object file",
     "cudnn-missing"),
    ("Traceback (most recent call last):\n  File \"<stdin>\", line 1, in <module>\n  File \"torch/__init__.py\", "
     "line 45, in <module>\n    from torch._C import *\nImportError: No module named _C", "shadowed-by-local-folder"),
]


@pytest.mark.parametrize("text,expected", CASES)
def test_best_match(text, expected):
    matches = explain(text)
    assert matches, text
    assert matches[0].id == expected, [m.id for m in matches]
    assert matches[0].cause and matches[0].fix


def test_flash_attn_symbol_is_demangled_and_explained():
    m = explain(CASES[2][0])[0]
    assert "c10::Error::Error" in m.cause and "C++ ABI" in m.cause


def test_rename_table_names_the_replacement():
    m = explain(CASES[10][0])[0]
    assert "get_expert_data_parallel_rank" in m.fix and "0.10" in m.cause


def test_last_error_of_a_log_wins_over_earlier_noise():
    log = ("WARNING: No module named 'einops' (optional)\n" * 3 +
           "Traceback (most recent call last):\n  File \"train.py\", line 1\n"
           "ImportError: cannot import name 'get_args' from 'megatron' (unknown location)\n")
    assert explain(log)[0].id == "megatron-training"


def test_unknown_text_has_no_match():
    assert explain("everything is fine\n") == []


def test_knowledge_base_has_30_sourced_signatures():
    source = Path(knowledge.__file__).read_text()
    urls = re.findall(r"# source: (https://github\.com/[\w.\-]+/[\w.\-]+/(?:issues|pull)/\d+)", source)
    sourced = [s for s in knowledge.SIGNATURES if s.source]
    assert len(sourced) >= 30
    assert len(urls) == len(sourced)
    assert {s.source for s in sourced} <= set(urls)
    assert len({s.id for s in knowledge.SIGNATURES}) == len(knowledge.SIGNATURES)


def test_cli_explain_json_from_stdin_and_file(fake: FakeEnv):
    run = fake.run("--explain", "-", "--json", stdin=CASES[0][0] + "\n")
    assert run.rc == 1
    assert run.json()["matches"][0] == {"id": "megatron-training", "cause": explain(CASES[0][0])[0].cause,
                                        "fix": explain(CASES[0][0])[0].fix, "confident": True}
    log = fake.file("log.txt", CASES[2][0] + "\n")
    text = fake.run("--explain", str(log))
    assert text.rc == 1 and "[flash-attn-abi]" in text.out and "github.com/Dao-AILab" in text.out
    none = fake.run("--explain", "-", "--json", stdin="all good\n")
    assert none.rc == 0 and none.json() == {"matches": []}
    missing = fake.run("--explain", str(fake.root / "nope.txt"))
    assert missing.rc == 2 and "no such file" in missing.err


def test_explain_takes_literal_text(fake: FakeEnv):
    run = fake.run("--explain", "ImportError: libcuda.so.1: cannot open shared object file: No such file or directory",
                   "--json")
    assert run.rc == 1 and run.json()["matches"][0]["id"] == "cuda-driver-missing"
    typo = fake.run("--explain", "logs/run.txt")
    assert typo.rc == 2 and "no such file: logs/run.txt" in typo.err


def test_no_fix_installs_an_import_name_that_is_another_project():
    """`pip install megatron` installs the unrelated PyPI project megatron 0.5.1: never print it."""
    from verl_bridge.doctor import dists
    from verl_bridge.doctor.env import DistIndex

    assert dists.bad_install('pip install megatron') == ["megatron"]
    assert dists.bad_install('pip install "megatron-core>=0.12,<0.20"') == []
    for sig in knowledge.SIGNATURES:
        assert not dists.bad_install(sig.fix), sig.id
    empty = DistIndex([])
    for name in list(dists.UNRELATED) + ["megatron.core", "megatron.core.timers", "megatron.training",
                                         "transformer_engine.pytorch", "flash_attn_2_cuda", "amp_C"]:
        for m in explain(f"ModuleNotFoundError: No module named '{name}'", install=lambda mod: dists.install_fix(mod, empty)):
            assert not dists.bad_install(m.fix), (name, m.fix)
        assert not dists.bad_install(dists.install_fix(name, empty)), name
    assert dists.install_fix("megatron.core.timers", empty) == 'pip install "megatron-core>=0.12,<0.20"'
    assert dists.install_fix("yaml", empty) == 'pip install "pyyaml"'


def test_missing_module_distribution_comes_from_data_never_a_guess():
    from verl_bridge.doctor import dists
    from verl_bridge.doctor.env import DistIndex

    empty = DistIndex([])
    facts = Facts(install=lambda mod: dists.install_fix(mod, empty))
    m = explain("ModuleNotFoundError: No module named 'sglang.srt'", facts=facts)
    assert [x.id for x in m] == ["python-missing-module"] and 'pip install "sglang"' in m[0].fix
    nemo = explain("ModuleNotFoundError: No module named 'nemo'", facts=facts)[0]
    assert 'pip install "nemo_toolkit"' in nemo.fix and nemo.confident
    unknown = explain("ModuleNotFoundError: No module named 'qzx_private_lib'", facts=facts)[0]
    assert not unknown.confident and "unknown" in unknown.fix and "pip install qzx" not in unknown.fix
    assert "qzx_private_lib/__init__.py" in unknown.fix


def test_megatron_lm_initialize_moved_parsing(fake: FakeEnv):
    """Megatron-LM >= core_v0.18: flags are parsed by parse_and_validate_args(), not initialize_megatron()."""
    old_call = fake.run("--explain", "TypeError: initialize_megatron() got an unexpected keyword argument "
                        "'extra_args_provider'", "--json")
    first = old_call.json()["matches"][0]
    assert old_call.rc == 1 and first["id"] == "megatron-lm-initialize-parse"
    assert "parse_and_validate_args" in first["fix"]
    unset = fake.run("--explain", "    assert var is not None, '{} is not initialized.'.format(name)\n"
                     "AssertionError: args is not initialized.", "--json")
    first = unset.json()["matches"][0]
    assert unset.rc == 1 and first["id"] == "megatron-args-not-initialized"
    assert "parse_and_validate_args()" in first["fix"] and "--no-persist-layer-norm" in first["fix"]
