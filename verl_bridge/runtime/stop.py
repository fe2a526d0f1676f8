"""SIGTERM / SIGINT: stop at a step boundary on every rank, save, say how to resume (Megatron-LM's
``--exit-signal-handler``).

The handler only records the signal. After each finished step every rank all-reduces the flag
(MAX over the world), so all ranks see the same answer at the same step and stop together: the
step in flight is finished, the last finished step is saved, a line names it and says
``trainer.resume=auto``, and the process exits with :data:`EXIT_CODES` (128 + the signal number:
143 for SIGTERM, 130 for SIGINT, as a shell reports a process killed by it). A second signal of
the same kind while stopping raises ``KeyboardInterrupt`` (abandon at once, no checkpoint).
"""

from __future__ import annotations

import signal
import threading
from typing import Optional

import torch
import torch.distributed as dist

SIGNALS = (signal.SIGTERM, signal.SIGINT)
EXIT_CODES = {signal.SIGTERM: 128 + signal.SIGTERM, signal.SIGINT: 128 + signal.SIGINT}  # 143, 130


class Stopped(Exception):
    """The run stopped on a signal after saving ``step``; ``exit_code`` is 128 + the signal number."""

    def __init__(self, signum: int, step: int, saved: bool, message: str):
        super().__init__(message)
        self.signum, self.step, self.saved = signum, step, saved
        self.exit_code = 128 + int(signum)


class StopSignals:
    """Install on :meth:`__enter__` (main thread only), restore the previous handlers on exit."""

    def __init__(self):
        self.received: Optional[int] = None
        self._previous: dict = {}

    def _handle(self, signum, frame):
        if self.received is not None:
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name}: stopping without a checkpoint")
        self.received = signum
        print(f"[WARN] {signal.Signals(signum).name} received: finishing the current step, then saving a "
              "checkpoint and stopping (send it again to stop at once without one)", flush=True)

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous.clear()

    def agreed(self, groups=(), device=None) -> Optional[int]:
        """The signal any rank received (the same answer on every rank), or None; call at step boundaries.

        ``groups``: process groups whose product covers the training ranks (TP, DP, PP: a MAX over
        each in turn is a MAX over the grid); none given: the whole world."""
        local = int(self.received or 0)
        if not (dist.is_available() and dist.is_initialized()):
            return local or None
        t = torch.tensor([local], dtype=torch.int64, device=device)
        for g in (groups or (None,)):
            if dist.get_world_size(g) > 1:
                dist.all_reduce(t, op=dist.ReduceOp.MAX, group=g)
        return int(t.item()) or None
