"""One run per output directory: a lock naming its holder, and a run id that says whose run it is.

``<trainer.output_dir>/run.lock`` is created by rank 0 before anything is written there (JSON:
``host``, ``pid``, ``run_id``, ``started``) and held with ``fcntl.flock`` while the run lives; it is
removed when the run ends (normally, by an error, or by SIGTERM/SIGINT).

* a lock whose holder is alive (the flock is held): the new run is refused, naming host and pid;
* a stale lock (no process holds the flock, e.g. the holder was SIGKILLed): refused too, naming the
  dead holder; remove the file (``rm <dir>/run.lock``) or start with ``trainer.break_stale_lock=true``,
  which takes over only a lock no live process holds.

``<trainer.output_dir>/run.json`` holds the run id. A new run (``trainer.resume=never``, the
default, or a checkpoint PATH) in a directory that already holds another run's ``metrics.jsonl``
or ``checkpoints/`` is refused unless the config says what to do: ``trainer.resume=auto``
continues that run (its id is kept), ``trainer.overwrite=true`` deletes its checkpoints and
metrics first. So ``keep_last`` pruning only ever sees checkpoints of the run it belongs to.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import time
import uuid
from typing import Optional

LOCK_NAME = "run.lock"
RUN_NAME = "run.json"


class RunDirError(RuntimeError):
    """The run directory is in use or holds another run; the message says what to do."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


class RunLock:
    """``run.lock`` in a run directory, held with flock until :meth:`release`."""

    def __init__(self, run_dir: str, run_id: str, fd: int, path: str):
        self.run_dir, self.run_id, self._fd, self.path = run_dir, run_id, fd, path

    @classmethod
    def acquire(cls, run_dir: str, run_id: str, *, break_stale: bool = False) -> "RunLock":
        import fcntl

        os.makedirs(run_dir, exist_ok=True)
        path = os.path.join(run_dir, LOCK_NAME)
        if os.path.islink(path):
            raise RunDirError(f"{path} is a symlink; remove it (verl-bridge does not follow links out of the "
                              "run directory)")
        holder = {"host": socket.gethostname(), "pid": os.getpid(), "run_id": run_id,
                  "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        for _ in range(2):
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
            except FileExistsError:
                cls._refuse_or_break(path, run_dir, break_stale)
                continue  # a stale lock was removed on request: try once more
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a fresh file: nobody else holds it
            os.write(fd, json.dumps(holder).encode())
            os.fsync(fd)
            return cls(run_dir, run_id, fd, path)
        raise RunDirError(f"{path}: another run took the lock while this one was starting")

    @staticmethod
    def _refuse_or_break(path: str, run_dir: str, break_stale: bool) -> None:
        import fcntl

        try:
            fd = os.open(path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            return  # released meanwhile
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                live = False
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                live = True
            holder = _read_json(path)
            host, pid = holder.get("host", "?"), holder.get("pid", "?")
            who = f"pid {pid} on host {host} (run {holder.get('run_id', '?')}, started {holder.get('started', '?')})"
            if live or (host == socket.gethostname() and isinstance(pid, int) and _pid_alive(pid)
                        and pid != os.getpid()):
                raise RunDirError(
                    f"trainer.output_dir={run_dir!r} is in use by {who}: one run per output directory. Wait "
                    "for it to finish, stop it, or give this run another trainer.output_dir")
            if not break_stale:
                raise RunDirError(
                    f"trainer.output_dir={run_dir!r} has a stale lock {path} left by {who}, which is no longer "
                    "running (it did not exit cleanly, e.g. SIGKILL or a node failure). If no run uses this "
                    f"directory, remove the lock (rm {path}) or start with trainer.break_stale_lock=true; then "
                    "trainer.resume=auto continues from its last checkpoint")
            os.unlink(path)  # still flocked by us: no live process can hold it
            print(f"[WARN] took over the stale lock {path} left by {who} (trainer.break_stale_lock=true)",
                  flush=True)
        finally:
            os.close(fd)

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            if _read_json(self.path).get("pid") == os.getpid():
                os.unlink(self.path)
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None


def _holds_a_run(run_dir: str) -> Optional[str]:
    """What in ``run_dir`` belongs to a run (``metrics.jsonl`` rows, ``checkpoints/``), or None."""
    found = []
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if os.path.isfile(metrics) and os.path.getsize(metrics) > 0:
        found.append("metrics.jsonl")
    ckpt = os.path.join(run_dir, "checkpoints")
    if os.path.isdir(ckpt) and any(os.scandir(ckpt)):
        found.append("checkpoints/")
    return " and ".join(found) or None


def claim_run_dir(run_dir: str, *, resume: str, overwrite: bool, break_stale: bool) -> RunLock:
    """Lock ``run_dir`` and make it this run's (see the module doc); raises :class:`RunDirError`."""
    os.makedirs(run_dir, exist_ok=True)
    previous = _read_json(os.path.join(run_dir, RUN_NAME)).get("run_id")
    run_id = previous if (resume == "auto" and previous) else uuid.uuid4().hex[:12]
    lock = RunLock.acquire(run_dir, run_id, break_stale=break_stale)
    try:
        held = _holds_a_run(run_dir)
        if held and resume != "auto":
            if not overwrite:
                raise RunDirError(
                    f"trainer.output_dir={run_dir!r} already holds a run ({held}"
                    + (f", run {previous}" if previous else "") + f") and trainer.resume={resume}: this run "
                    "would mix its metrics and checkpoints with it. Continue that run with trainer.resume=auto, "
                    "replace it with trainer.overwrite=true (deletes its checkpoints and metrics.jsonl), or "
                    "give this run another trainer.output_dir")
            for name in ("checkpoints", "metrics.jsonl"):
                p = os.path.join(run_dir, name)
                if os.path.isdir(p) and not os.path.islink(p):
                    shutil.rmtree(p)
                elif os.path.lexists(p):
                    os.unlink(p)
            print(f"[WARN] trainer.overwrite=true: deleted the previous run's {held} in {run_dir}", flush=True)
        tmp = os.path.join(run_dir, f".{RUN_NAME}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"run_id": run_id, "continued": bool(previous and run_id == previous)}, f)
        os.replace(tmp, os.path.join(run_dir, RUN_NAME))
    except BaseException:
        lock.release()
        raise
    return lock
