"""Explain ``undefined symbol`` errors from native extensions.

The mangled name says who is missing: ``_ZN3c10``/``_ZN2at``/``_ZN5torch`` are libtorch
(the extension was built against another torch), ``__cxx11`` versus ``Ss`` is the C++ string
ABI (``_GLIBCXX_USE_CXX11_ABI`` differs between the extension and torch), ``nccl*`` is the
NCCL library, ``cuda*``/``cu*`` the CUDA runtime or driver, ``nvte_*`` Transformer Engine's core.
Names are demangled with ``c++filt`` when it is on PATH.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

_UNDEFINED = re.compile(r"undefined symbol:?\s*([A-Za-z_][\w.$@]*)")
_SO = re.compile(r"([\w./\-+]*?([A-Za-z_][\w\-]*?)(?:\.cpython-[\w\-]+|\.abi3)?\.so(?:\.[\d.]+)?)\s*:\s*undefined symbol")


def undefined_symbols(text: str) -> list[str]:
    seen: list[str] = []
    for sym in _UNDEFINED.findall(text or ""):
        if sym not in seen:
            seen.append(sym)
    return seen


def failing_library(text: str) -> str | None:
    """The shared object that had the undefined symbol, as written in the error."""
    m = _SO.search(text or "")
    return m.group(1) if m else None


def demangle(symbols: list[str], timeout: float = 1.0) -> dict[str, str]:
    out = {s: s for s in symbols}
    tool = shutil.which("c++filt")
    mangled = [s for s in symbols if s.startswith("_Z")]
    if not tool or not mangled:
        return out
    try:
        proc = subprocess.run([tool], input="\n".join(mangled) + "\n", capture_output=True,
                              text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return out
    lines = proc.stdout.splitlines()
    if len(lines) == len(mangled):
        out.update(dict(zip(mangled, lines)))
    return out


@dataclass
class SymbolDiagnosis:
    symbol: str
    demangled: str
    kind: str  # "cxx11-abi" | "old-abi" | "torch" | "nccl" | "cuda" | "te-core" | "other"
    cause: str


def classify(symbol: str, demangled: str | None = None, torch_cxx11_abi: bool | None = None) -> SymbolDiagnosis:
    d = demangled or symbol
    wants_new_abi = "__cxx11" in symbol or "cxx11" in d
    wants_old_abi = bool(re.search(r"(?:^_Z|[A-Z0-9])Ss", symbol)) or (
        "std::string" in d or re.search(r"std::basic_string<char, std::char_traits<char>", d or "") is not None
    ) and "__cxx11" not in d
    torchy = bool(re.match(r"_ZN?K?\d*(3c10|2at|5torch|6caffe2)", symbol)) or re.match(r"(c10|at|torch|caffe2)::", d) is not None
    if wants_new_abi and torch_cxx11_abi is not True:
        abi = "torch uses the old ABI (_GLIBCXX_USE_CXX11_ABI=0)" if torch_cxx11_abi is False else "torch was built with the other ABI"
        return SymbolDiagnosis(symbol, d, "cxx11-abi",
                               f"C++ ABI mismatch: the extension was built with _GLIBCXX_USE_CXX11_ABI=1 (std::__cxx11::string) but {abi}")
    if wants_old_abi and torch_cxx11_abi is not False and not wants_new_abi:
        abi = "torch uses the new ABI (_GLIBCXX_USE_CXX11_ABI=1)" if torch_cxx11_abi else "torch was built with the other ABI"
        return SymbolDiagnosis(symbol, d, "old-abi",
                               f"C++ ABI mismatch: the extension was built with _GLIBCXX_USE_CXX11_ABI=0 (old std::string) but {abi}")
    if torchy:
        return SymbolDiagnosis(symbol, d, "torch",
                               "the extension was built against a different torch version than the one installed "
                               f"(libtorch does not export {d})")
    if symbol.startswith("nccl"):
        return SymbolDiagnosis(symbol, d, "nccl",
                               f"the NCCL library that was loaded is older than the one torch was built with (it lacks {symbol}); "
                               "usually a second NCCL copy (system libnccl or another nvidia-nccl wheel) is found first")
    if re.match(r"(cuda|cu[A-Z]|cublas|cudnn|nvrtc)", symbol):
        return SymbolDiagnosis(symbol, d, "cuda",
                               f"the CUDA runtime or driver that was loaded is older than the one the extension needs (it lacks {symbol})")
    if symbol.startswith("nvte_"):
        return SymbolDiagnosis(symbol, d, "te-core",
                               "Transformer Engine's framework extension and its core library (libtransformer_engine.so) "
                               "come from different Transformer Engine versions")
    return SymbolDiagnosis(symbol, d, "other",
                           f"the extension was built against other versions of its dependencies (missing {d})")


def diagnose(text: str, torch_cxx11_abi: bool | None = None) -> list[SymbolDiagnosis]:
    syms = undefined_symbols(text)
    names = demangle(syms)
    return [classify(s, names.get(s), torch_cxx11_abi) for s in syms]
