"""Run real imports in subprocesses, in parallel, under one deadline.

A probe is a list of steps (import a module, or load one module file without running its
package's ``__init__``). The child prints one marked JSON line when a step starts and one when
it ends, so a step that hangs or crashes the interpreter (a segfaulting extension) is still
named. The doctor's own process never imports what it probes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

MARK = "@@VERL_BRIDGE_DOCTOR@@"

_CHILD = r'''
import importlib, importlib.util, json, sys, traceback, warnings
warnings.simplefilter("ignore")
MARK = %r
out = sys.__stdout__
def emit(d):
    out.write("\n" + MARK + json.dumps(d) + "\n"); out.flush()
def plain(v):
    return v if isinstance(v, (bool, int, float, str, type(None))) else str(v)
for step in json.loads(sys.argv[1]):
    emit({"step": step["name"], "started": True})
    try:
        if step["kind"] == "exec":
            m = None
            scope = {"sys": sys, "importlib": importlib}
            exec(step["code"], scope)
            m = scope.get("m")
        elif step["kind"] == "load":
            spec = importlib.util.spec_from_file_location(step["module"], step["path"])
            m = importlib.util.module_from_spec(spec)
            sys.modules[step["module"]] = m
            spec.loader.exec_module(m)
        else:
            m = importlib.import_module(step["module"])
        data = {}
        for key, expr in step.get("data", {}).items():
            try:
                data[key] = plain(eval(expr, {"m": m, "sys": sys, "importlib": importlib}))
            except BaseException as e:
                data[key] = None
        emit({"step": step["name"], "ok": True, "data": data})
    except BaseException as e:
        emit({"step": step["name"], "ok": False, "error": (type(e).__name__ + ": " + str(e))[:4000],
              "traceback": traceback.format_exc()[-6000:]})
        if step.get("stop_on_error"):
            break
''' % (MARK,)


@dataclass
class Step:
    name: str
    module: str
    kind: str = "import"  # "import" | "load" | "exec"
    path: str | None = None  # file to load for kind == "load"
    code: str = ""  # for kind == "exec": statements that raise on failure and may bind `m`
    data: dict[str, str] = field(default_factory=dict)  # key -> expression over the module `m`
    stop_on_error: bool = False

    def to_json(self) -> dict:
        return {
            "name": self.name, "module": self.module, "kind": self.kind, "path": self.path, "code": self.code,
            "data": self.data, "stop_on_error": self.stop_on_error,
        }


@dataclass
class StepResult:
    name: str
    status: str  # "ok" | "error" | "timeout" | "crash" | "not-run"
    error: str = ""
    traceback: str = ""
    data: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def describe(self) -> str:
        if self.status == "ok":
            return "imports"
        if self.status == "timeout":
            return "did not finish before the doctor's deadline (not verified)"
        if self.status == "crash":
            return f"crashed the interpreter ({self.error})"
        if self.status == "not-run":
            return "not tried"
        return self.error


def _interpreter_flags() -> list[str]:
    """Run probes under the same interpreter configuration as the doctor (-S, -s, -E, -I)."""
    from .env import interpreter_flags

    return interpreter_flags()


class Probe:
    def __init__(self, name: str, steps: list[Step]) -> None:
        self.name = name
        self.steps = steps
        self.proc: subprocess.Popen | None = None
        self.results: dict[str, StepResult] = {}
        self.stderr = ""
        self.elapsed = 0.0
        self.start_error: str | None = None
        self._t0 = 0.0

    def start(self, cwd: str | None = None) -> None:
        """Start the child: ``python -c`` in ``cwd``, so its sys.path is the user's ``python``'s
        there (the current directory first)."""
        env = dict(os.environ)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.setdefault("PYTHONWARNINGS", "ignore")
        env["TF_CPP_MIN_LOG_LEVEL"] = "3"
        self._t0 = time.monotonic()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, *_interpreter_flags(), "-c", _CHILD, json.dumps([s.to_json() for s in self.steps])],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=env, start_new_session=True, cwd=cwd,
            )
        except OSError as exc:
            self.start_error = f"could not start {sys.executable}: {exc}"

    def finish(self, deadline: float) -> None:
        timed_out = False
        out = err = b""
        if self.proc is not None:
            try:
                out, err = self.proc.communicate(timeout=max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                self._kill()
                try:
                    out, err = self.proc.communicate(timeout=2)
                except subprocess.TimeoutExpired:
                    out, err = b"", b""
        self.elapsed = time.monotonic() - self._t0
        self.stderr = err.decode("utf-8", "replace")[-8000:]
        self._parse(out.decode("utf-8", "replace"), timed_out)

    def _kill(self) -> None:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the probe's own session, started above
        except (ProcessLookupError, PermissionError, OSError):
            try:
                self.proc.kill()
            except OSError:
                pass

    def _parse(self, stdout: str, timed_out: bool) -> None:
        started: list[str] = []
        for line in stdout.splitlines():
            if not line.startswith(MARK):
                continue
            try:
                rec = json.loads(line[len(MARK):])
            except ValueError:
                continue
            name = rec.get("step", "")
            if rec.get("started"):
                started.append(name)
                continue
            self.results[name] = StepResult(
                name, "ok" if rec.get("ok") else "error", rec.get("error", ""),
                rec.get("traceback", ""), rec.get("data") or {},
            )
        rc = self.proc.returncode if self.proc is not None else None
        for step in self.steps:
            if step.name in self.results:
                continue
            if self.start_error:
                self.results[step.name] = StepResult(step.name, "crash", self.start_error)
            elif step.name in started and timed_out:
                self.results[step.name] = StepResult(step.name, "timeout")
            elif step.name in started:
                how = f"signal {-rc}" if isinstance(rc, int) and rc < 0 else f"exit code {rc}"
                tail = self.stderr.strip().splitlines()[-1:] or [""]
                self.results[step.name] = StepResult(step.name, "crash", f"{how} {tail[0]}".strip(), self.stderr)
            elif timed_out:
                self.results[step.name] = StepResult(step.name, "timeout")
            else:
                self.results[step.name] = StepResult(step.name, "not-run")

    def get(self, step: str) -> StepResult:
        return self.results.get(step) or StepResult(step, "not-run")


def run_probes(probes: list[Probe], timeout: float, cwd: str | None = None, progress=None) -> None:
    """Start every probe at once and collect them all before ``timeout`` seconds have passed.

    Each probe is collected by its own thread (``communicate`` drains both pipes, so a chatty
    import never blocks); ``progress(waiting, elapsed)`` is called about once a second while
    some are still running.
    """
    import threading

    t0 = time.monotonic()
    deadline = t0 + timeout
    for p in probes:
        p.start(cwd)
    threads = [threading.Thread(target=p.finish, args=(deadline,), daemon=True) for p in probes]
    for t in threads:
        t.start()
    for p, t in zip(probes, threads):
        while t.is_alive():
            t.join(timeout=1.0)
            if t.is_alive() and progress is not None:
                waiting = [q.name for q, u in zip(probes, threads) if u.is_alive()]
                progress(waiting, time.monotonic() - t0)
