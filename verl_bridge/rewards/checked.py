"""Reward functions checked where rewards are produced: a time limit per call and a finite number back.

A user's ``reward_fn(response, ground_truth)`` that raises, hangs, or returns NaN, inf, None, a
list or a string used to surface later and elsewhere (``actor_loss is nan; lower optim.actor.lr``).
:func:`score_all` calls it once per sample and raises :class:`RewardFunctionError` naming the
function (``module:function``), the sample index and the value, at the step that produced it.

* value: a real number (``int``, ``float``, ``bool``, a numpy scalar, a one-element tensor) that is
  finite; a string is refused even when it spells a number (``"0.5"``);
* time: each call runs on a daemon worker thread and may take ``model.reward.args.timeout_s``
  seconds (:data:`DEFAULT_TIMEOUT_S` when unset; ``0`` turns the limit off). A call past it is
  abandoned (Python cannot stop a thread) and the run ends with an error naming the function.
"""

from __future__ import annotations

import math
import numbers
import queue
import threading
from typing import Callable, Optional

DEFAULT_TIMEOUT_S = 60.0  # model.reward.args.timeout_s when unset


class RewardFunctionError(RuntimeError):
    """A reward function raised, hung past its time limit, or returned something that is not a finite number."""


def function_name(fn: Callable) -> str:
    """``module:function`` of a (possibly wrapped) reward function."""
    inner = fn
    while hasattr(inner, "__wrapped__"):
        inner = inner.__wrapped__
    module = getattr(inner, "__module__", None) or "?"
    name = getattr(inner, "__qualname__", None) or getattr(inner, "__name__", None) or type(inner).__name__
    return f"{module}:{name}"


def _short(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _as_float(value) -> Optional[float]:
    if isinstance(value, numbers.Real):
        return float(value)
    if getattr(value, "ndim", None) == 0 or (hasattr(value, "numel") and callable(value.numel)
                                               and value.numel() == 1):
        try:
            item = value.item()
        except (AttributeError, TypeError, ValueError, RuntimeError):
            return None
        return float(item) if isinstance(item, numbers.Real) else None
    return None


class _Worker:
    """One daemon thread that runs the calls, so a hung call can be waited for with a deadline."""

    def __init__(self):
        self.jobs: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._loop, name="verl-bridge-reward", daemon=True)
        self.thread.start()

    def _loop(self):
        while True:
            fn, args, box, done = self.jobs.get()
            try:
                box.append(("ok", fn(*args)))
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller as it is
                box.append(("raised", exc))
            done.set()

    def call(self, fn, args, timeout_s: Optional[float]):
        box: list = []
        done = threading.Event()
        self.jobs.put((fn, args, box, done))
        if not done.wait(timeout_s):
            return None  # timed out: this worker is stuck in the call and must not be reused
        return box[0]


class CheckedReward:
    """``reward_fn`` with its name, a time limit per call and a check of each value (see the module doc)."""

    def __init__(self, fn: Callable, name: Optional[str] = None, timeout_s: Optional[float] = None):
        self.fn = fn
        self.name = name or function_name(fn)
        self.timeout_s = DEFAULT_TIMEOUT_S if timeout_s is None else float(timeout_s)
        self.__wrapped__ = fn
        self._worker: Optional[_Worker] = None

    def __call__(self, response, ground_truth) -> float:
        return self.score([response], [ground_truth])[0]

    def _call(self, args):
        if self.timeout_s <= 0:
            try:
                return ("ok", self.fn(*args))
            except Exception as exc:  # noqa: BLE001 - named below
                return ("raised", exc)
        if self._worker is None:
            self._worker = _Worker()
        out = self._worker.call(self.fn, args, self.timeout_s)
        if out is None:
            self._worker = None  # the stuck thread keeps running; the next call gets a fresh one
        return out

    def score(self, responses: list, ground_truths: list) -> list[float]:
        values = []
        for i, (response, truth) in enumerate(zip(responses, ground_truths)):
            out = self._call((response, truth))
            where = f"reward function {self.name} on sample {i} (response {_short(response, 60)})"
            if out is None:
                raise RewardFunctionError(
                    f"{where} did not return within model.reward.args.timeout_s={self.timeout_s:g} s; "
                    "make it faster or raise the limit (0 turns it off)")
            kind, value = out
            if kind == "raised":
                if isinstance(value, (KeyboardInterrupt, SystemExit)):
                    raise value
                raise RewardFunctionError(f"{where} raised {type(value).__name__}: {value}") from value
            number = _as_float(value)
            if number is None:
                raise RewardFunctionError(
                    f"{where} returned {_short(value)} ({type(value).__name__}); a reward function must "
                    "return one finite number (int or float) per sample")
            if not math.isfinite(number):
                raise RewardFunctionError(
                    f"{where} returned {number}; a reward must be a finite number (the reward function is "
                    "at fault, not the learning rate)")
            values.append(number)
        return values


def checked_reward(fn: Callable, name: Optional[str] = None, timeout_s: Optional[float] = None) -> CheckedReward:
    """``fn`` as a :class:`CheckedReward` (unchanged when it is one already)."""
    if isinstance(fn, CheckedReward):
        return fn
    return CheckedReward(fn, name=name, timeout_s=timeout_s)


def score_all(fn: Callable, responses: list, ground_truths: list) -> list[float]:
    """One checked float per sample (``fn`` wrapped with the default limit when it is a plain callable)."""
    return checked_reward(fn).score(responses, ground_truths)
