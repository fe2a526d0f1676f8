"""Build real broken Python environments in temporary directories.

A ``FakeEnv`` is a folder of packages and ``*.dist-info`` metadata. ``run()`` starts the doctor
as a subprocess with that folder first on PYTHONPATH. With ``isolated=True`` the interpreter
runs with ``-S`` (no site-packages), so only the fake packages plus a support folder holding
the doctor's own dependencies (click, yaml, verl_bridge) are importable; the doctor passes
``-S`` on to its probes, so they see the same environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import click
import yaml

import verl_bridge

REPO = Path(verl_bridge.__file__).resolve().parent.parent


class FakeEnv:
    def __init__(self, root: Path, isolated: bool = True) -> None:
        self.root = root
        self.site = root / "site"
        self.site.mkdir(parents=True, exist_ok=True)
        self.extra_paths: list[Path] = []
        self.isolated = isolated
        self.support = root / "support"
        if isolated:
            self.support.mkdir(exist_ok=True)
            for mod in (click, yaml, verl_bridge):
                src = Path(mod.__file__).resolve().parent
                (self.support / src.name).symlink_to(src)

    # -- building ---------------------------------------------------------------------------
    def dist(self, name: str, version: str, requires: list[str] | None = None, where: Path | None = None,
             files: list[str] | None = None) -> Path:
        """A *.dist-info; ``files`` (paths relative to the site folder) go into its RECORD."""
        where = where or self.site
        info = where / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
        lines += [f"Requires-Dist: {r}" for r in requires or []]
        (info / "METADATA").write_text("\n".join(lines) + "\n")
        if files is not None:
            (info / "RECORD").write_text("".join(f"{f},," + "\n" for f in files + [f"{info.name}/METADATA"]))
        return info

    def file(self, rel: str, content: str = "", where: Path | None = None) -> Path:
        path = (where or self.site) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(content))
        return path

    def new_path(self, name: str) -> Path:
        """Another directory, placed BEFORE ``site`` on PYTHONPATH."""
        p = self.root / name
        p.mkdir(exist_ok=True)
        self.extra_paths.append(p)
        return p

    def torch(self, version: str = "2.5.1", cuda: str | None = "12.4", cxx11abi: bool = False,
              nccl: tuple | None = (2, 21, 5), requires: list[str] | None = None, body: str = "") -> None:
        self.dist("torch", version, requires if requires is not None else ["nvidia-nccl-cu12==2.21.5"])
        self.file("torch/__init__.py", f"""
            {body}
            __version__ = {version!r}
            class version:
                cuda = {cuda!r}
            class _C:
                _GLIBCXX_USE_CXX11_ABI = {cxx11abi!r}
            class cuda:
                class nccl:
                    @staticmethod
                    def version():
                        return {nccl!r}
            """)

    def megatron_core(self, version: str = "0.13.1", init: str = "", training: bool = True, where: Path | None = None) -> None:
        major, minor, patch = version.split(".")
        core_files = ["megatron/core/__init__.py", "megatron/core/package_info.py", "megatron/core/parallel_state.py"]
        self.dist("megatron-core", version, where=where, files=core_files)
        self.file("megatron/core/__init__.py", init, where=where)
        self.file("megatron/core/package_info.py", f"""
            MAJOR = {major}
            MINOR = {minor}
            PATCH = {patch}
            PRE_RELEASE = ""
            VERSION = (MAJOR, MINOR, PATCH, PRE_RELEASE)
            __version__ = '.'.join(map(str, VERSION[:3])) + ''.join(VERSION[3:])
            """, where=where)
        self.file("megatron/core/parallel_state.py", "def get_expert_data_parallel_group():\n    pass\n", where=where)
        if training:
            self.file("megatron/training/__init__.py", "", where=where)

    def healthy(self) -> "FakeEnv":
        self.torch()
        self.dist("nvidia-nccl-cu12", "2.21.5")
        self.megatron_core()
        self.dist("verl-bridge", "0.1.0", ["torch>=2.4", "megatron-core>=0.12,<0.20"])
        return self

    # -- running ----------------------------------------------------------------------------
    def environ(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "LD_LIBRARY_PATH"))}
        paths = [*map(str, self.extra_paths), str(self.site)]
        if self.isolated:
            paths.append(str(self.support))
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env["PYTHONIOENCODING"] = "utf-8"
        # a generous probe deadline: on a loaded 2-core CI box a healthy import can take seconds;
        # the deadline test passes --timeout itself
        env.setdefault("VERL_BRIDGE_DOCTOR_TIMEOUT", "30")
        return env

    def run(self, *args: str, timeout: float = 60, stdin: str | None = None) -> "Run":
        cmd = [sys.executable, *(["-S"] if self.isolated else []), "-m", "verl_bridge.doctor", *args]
        t0 = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=self.environ(), cwd=self.root,
                              timeout=timeout, input=stdin)
        return Run(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - t0)


class Run:
    def __init__(self, rc: int, out: str, err: str, elapsed: float) -> None:
        self.rc, self.out, self.err, self.elapsed = rc, out, err, elapsed

    def json(self) -> dict:
        try:
            return json.loads(self.out)
        except ValueError as exc:
            raise AssertionError(f"not JSON (rc={self.rc}):\n{self.out}\n{self.err}") from exc

    def checks(self) -> dict[str, dict]:
        return {c["id"]: c for c in self.json()["checks"]}

    def __repr__(self) -> str:
        return f"Run(rc={self.rc}, elapsed={self.elapsed:.1f}s)\n{self.out}\n{self.err}"
