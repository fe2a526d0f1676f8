"""A bounded wait on stuck peers: ``trainer.collective_timeout_s`` and an error that names the peer.

The process groups are created with ``trainer.collective_timeout_s`` (default
:data:`DEFAULT_COLLECTIVE_TIMEOUT_S`) as their timeout, so a collective whose peer stopped (SIGSTOP,
a hung host) fails on the surviving rank after that long instead of hanging for good. Each rank
also writes a heartbeat (its time, host and pid) into the rendezvous store from a daemon thread;
a stopped process stops beating. :func:`explain_timeout` turns the backend's timeout error into one
paragraph naming the collective (from the traceback) and the ranks whose heartbeat went silent.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import traceback
from datetime import timedelta
from typing import Optional

DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0
_PREFIX = "verl_bridge/heartbeat/"


class CollectiveTimeout(RuntimeError):
    """A collective did not complete within ``trainer.collective_timeout_s``."""


class Heartbeat:
    """A daemon thread writing ``time host pid`` under this rank's key every ``period_s``."""

    def __init__(self, store, rank: int, period_s: float):
        self.store, self.rank, self.period_s = store, rank, period_s
        self._stop = threading.Event()
        self._beat()
        self._thread = threading.Thread(target=self._loop, name="verl-bridge-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self):
        self.store.set(f"{_PREFIX}{self.rank}", f"{time.time()} {socket.gethostname()} {os.getpid()}")

    def _loop(self):
        while not self._stop.wait(self.period_s):
            try:
                self._beat()
            except Exception:  # noqa: BLE001 - the store went away (teardown, rank 0 gone): stop beating
                return

    def stop(self):
        self._stop.set()


_HEARTBEAT: Optional[Heartbeat] = None
_TIMEOUT_S: float = DEFAULT_COLLECTIVE_TIMEOUT_S


def set_collective_timeout(seconds: Optional[float]) -> None:
    """The timeout of the process groups created from now on (``trainer.collective_timeout_s``)."""
    global _TIMEOUT_S
    _TIMEOUT_S = float(seconds) if seconds else DEFAULT_COLLECTIVE_TIMEOUT_S


def collective_timeout_s() -> float:
    return _TIMEOUT_S


def start_heartbeat() -> None:
    """Beat into the default group's store (a world of more than one rank only)."""
    global _HEARTBEAT
    import torch.distributed as dist

    if _HEARTBEAT is not None or not dist.is_initialized() or dist.get_world_size() == 1:
        return
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        store = _get_default_store()
    except (ImportError, RuntimeError):
        return
    _HEARTBEAT = Heartbeat(store, dist.get_rank(), period_s=max(0.2, min(5.0, _TIMEOUT_S / 5)))


def stop_heartbeat() -> None:
    global _HEARTBEAT
    if _HEARTBEAT is not None:
        _HEARTBEAT.stop()
        _HEARTBEAT = None


def is_timeout(exc: BaseException) -> bool:
    """The backend's own timeout error (gloo: "Timed out waiting ...", NCCL's watchdog), not ours."""
    text = str(exc).lower()
    return (isinstance(exc, (RuntimeError, OSError)) and not isinstance(exc, CollectiveTimeout)
            and ("timed out" in text or "watchdog caught collective operation timeout" in text))


def _collective(exc: BaseException) -> str:
    """``all_reduce (called from megatron/core/tensor_parallel/mappings.py:_reduce)`` from the traceback."""
    frames = traceback.extract_tb(exc.__traceback__)
    paths = [f.filename.replace(os.sep, "/") for f in frames]
    outside = [i for i, p in enumerate(paths) if "/torch/" not in p]  # frames outside torch, outermost first
    c10d = next((i for i, p in enumerate(paths) if p.endswith("torch/distributed/distributed_c10d.py")), None)
    if c10d is not None:
        op = frames[c10d].name
        # the nearest frame outside torch above it (torch's own wrappers, e.g. c10d_logger, say nothing)
        at = next((i for i in reversed(outside) if i < c10d), None)
    elif outside:
        # an async collective's handle.wait() (megatron's TP linear backward waits on its dgrad all-reduce
        # this way): torch's frames are gone, the waiting line outside torch says where
        at = outside[-1]
        op = "wait() on an async collective" if ".wait(" in (frames[at].line or "") else "a collective"
    else:
        return "a collective"
    where = ""
    if at is not None:
        path, caller = paths[at], frames[at]
        for root in ("verl_bridge/", "megatron/"):
            if root in path:
                path = root + path.split(root, 1)[1]
                break
        where = f" (called from {path}:{caller.lineno} {caller.name})"
    return f"{op}{where}"


def _silent_peers(world_size: int, me: int) -> list[tuple[int, Optional[str], Optional[int], Optional[float]]]:
    """``(rank, host, pid, seconds since its last beat)`` of each peer whose heartbeat stopped."""
    if _HEARTBEAT is None:
        return []
    store, now, stale = _HEARTBEAT.store, time.time(), []
    limit = 3 * _HEARTBEAT.period_s
    try:
        store.set_timeout(timedelta(seconds=5))
    except (AttributeError, RuntimeError):
        pass
    for r in range(world_size):
        if r == me:
            continue
        try:
            stamp, host, pid = store.get(f"{_PREFIX}{r}").decode().split()
        except Exception:  # noqa: BLE001 - a store on a stopped rank 0 cannot answer
            stale.append((r, None, None, None))
            continue
        age = now - float(stamp)
        if age > limit:
            stale.append((r, host, int(pid), age))
    return stale


def silent_ranks(world_size: int, me: int) -> list[str]:
    """``rank R (host H, pid P): no heartbeat for S s`` for each peer whose heartbeat stopped."""
    return [f"rank {r} (its heartbeat could not be read)" if host is None
            else f"rank {r} (host {host}, pid {pid}): no heartbeat for {age:.0f} s"
            for r, host, pid, age in _silent_peers(world_size, me)]


def _stopped(pid: int) -> bool:
    """True when ``pid`` is a stopped process of this host (state T/t in /proc: SIGSTOP, a debugger)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def end_stopped_peers(world_size: int, me: int) -> list[str]:
    """SIGKILL the silent peers that are stopped processes on this host; what was ended.

    A stopped process cannot act on torchrun's SIGTERM, so torchrun would wait its fixed 30 s grace
    before killing it; the job is over anyway (a collective timed out), so it ends now, within
    ``trainer.collective_timeout_s``. Running (hung) peers are left to torchrun's SIGTERM.
    """
    import signal

    host = socket.gethostname()
    ended = []
    for r, h, pid, _ in _silent_peers(world_size, me):
        if h == host and pid and pid != os.getpid() and _stopped(pid):
            try:
                os.kill(pid, signal.SIGKILL)
                ended.append(f"rank {r} (pid {pid})")
            except OSError:
                pass
    return ended


def explain_timeout(exc: BaseException, rank: int, world_size: int) -> CollectiveTimeout:
    peers = silent_ranks(world_size, rank)
    who = ("; not responding: " + ", ".join(peers)) if peers else (
        "; every peer's heartbeat is current, so a peer is slow or blocked in other code")
    ended = end_stopped_peers(world_size, rank)
    if ended:
        who += f" ({', '.join(ended)} was a stopped process on this host and has been killed so the job ends now)"
    return CollectiveTimeout(
        f"rank {rank}: {_collective(exc)} did not complete within trainer.collective_timeout_s="
        f"{_TIMEOUT_S:g} s{who}. The job stops; a stopped (SIGSTOP) or hung peer process is the usual cause "
        f"(check it with ps/py-spy), then restart with trainer.resume=auto. Backend said: {str(exc).strip()[:300]}")
