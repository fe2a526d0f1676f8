"""Run outputs: the seed article's console lines, metrics.jsonl, and a progress bar on a TTY."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Optional

from verl_bridge.checkpoint.layout import atomic_write_text
from verl_bridge.common.log import info, warn  # noqa: F401  (their old home; callers import them from here too)


class MetricsFileError(RuntimeError):
    """metrics.jsonl cannot be continued (a corrupt line, or a symlink where the file should be)."""


def _open_append(path):
    """Append to *path*, creating it; never through a symlink (``O_NOFOLLOW``)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError as exc:
        if os.path.islink(path):
            raise MetricsFileError(f"{path} is a symlink (to {os.readlink(path)}); verl-bridge writes its metrics "
                                   "only to a regular file in the run directory. Remove the link.") from None
        raise
    return os.fdopen(fd, "a", encoding="utf-8")


def _eval_text(metrics: dict) -> str:
    text = f"reward={metrics['eval/reward_mean']:.3f}"
    if "eval/accuracy" in metrics:
        text += f", accuracy={metrics['eval/accuracy']:.3f}"
    return text + f", response_length={metrics['eval/response_length']:.1f}"


class MetricsLogger:
    """Rank 0 writes ``<run_dir>/metrics.jsonl`` (one object per step), the console lines, and the
    trackers of ``trainer.loggers`` (TensorBoard, wandb, MLflow: :mod:`verl_bridge.runtime.trackers`)."""

    def __init__(self, run_dir: Optional[str], total_steps: int, enabled: bool, progress_bar: Optional[bool],
                 log_every: int = 1, config=None):
        self.enabled = enabled
        self.log_every = log_every
        self.total = total_steps
        loggers = list(config.trainer.loggers) if config is not None else ["console", "jsonl"]
        self.console = "console" in loggers
        self.path = os.path.join(run_dir, "metrics.jsonl") if (run_dir and enabled and "jsonl" in loggers) else None
        self.trackers: list = []
        if enabled and config is not None:
            from verl_bridge.config import dump_config
            from verl_bridge.runtime.trackers import build_trackers

            self.trackers = build_trackers(config, dump_config(config))
        if enabled:
            from verl_bridge.runtime.mcore_notices import summary

            notices = summary()  # megatron-core's fallback warnings, folded by the train entry
            if notices:
                info(notices)
        show_bar = sys.stdout.isatty() if progress_bar is None else progress_bar
        self._progress = None
        if enabled and show_bar:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(
                TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                TextColumn("reward={task.fields[reward]:.3f}"), TimeRemainingColumn(), transient=True,
            )
            self._task = self._progress.add_task("train", total=total_steps, reward=0.0)
            self._progress.start()

    def truncate_after(self, step: int) -> None:
        """On resume: keep the rows of steps <= ``step`` (later ones belong to the lost tail).

        A half-written last line (a crash in the middle of :meth:`log`) is dropped with a warning;
        a line that does not parse anywhere else is refused, naming the file and the line, and
        the file is left as it is. The file is rewritten through a new file (a symlink at its
        name is replaced, its target never written).
        """
        if not self.path or not os.path.lexists(self.path):
            return
        keep = []
        with open(self.path, "rb") as f:
            raw = f.read().split(b"\n")
        last = len(raw) - 1  # raw[-1] is what follows the final newline ("" when the file ends cleanly)
        for i, chunk in enumerate(raw):
            if not chunk.strip():
                continue
            try:
                row = json.loads(chunk.decode("utf-8"))
                row_step = row["step"]
                if not isinstance(row_step, int):
                    raise TypeError(f"step is {row_step!r}")
            except (ValueError, KeyError, TypeError) as exc:
                if i == last:  # no newline after it: the write was cut short
                    warn(f"{self.path}: dropping a half-written last line (line {i + 1}, {len(chunk)} bytes) "
                         "left by an interrupted run")
                    continue
                raise MetricsFileError(
                    f"{self.path} line {i + 1} is not a metrics record ({type(exc).__name__}: {exc}); "
                    "resume does not rewrite a file it cannot read. Repair or remove that line (or move "
                    "the file away) and resume again.") from None
            if row_step <= step:
                keep.append(chunk.decode("utf-8") + "\n")
        atomic_write_text(self.path, "".join(keep))

    def reset(self) -> None:
        """A fresh run: start metrics.jsonl empty."""
        if self.path and os.path.lexists(self.path):
            os.remove(self.path)  # a symlink is removed, not followed

    def log(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        record = {"step": step, **metrics, "time": time.time()}
        if self.path:
            with _open_append(self.path) as f:
                f.write(json.dumps(record) + "\n")
        for tracker in self.trackers:
            tracker.log(step, metrics)
        if self._progress is not None:
            self._progress.update(self._task, completed=step, reward=metrics.get("reward_mean", 0.0))
        if not self.console:
            return
        if "actor_loss" not in metrics:  # an evaluation-only record (step 0, before training)
            info(f"Evaluation at step {step}: {_eval_text(metrics)}")
            return
        if step % self.log_every == 0 or step == self.total:
            line = (f"Training step {step}: loss={metrics['actor_loss']:.3f}, "
                    f"reward={metrics['reward_mean']:.3f}, kl={metrics['kl']:.3f}")
            if "critic_loss" in metrics:
                line += f", critic_loss={metrics['critic_loss']:.3f}"
            line += f", entropy={metrics['entropy']:.3f}, {metrics['throughput_tokens_per_s']:.0f} tok/s"
            if "eval/reward_mean" in metrics:
                line += f" | eval: {_eval_text(metrics)}"
            if self._progress is not None:
                self._progress.console.print(f"[INFO] {line}", markup=False, highlight=False)
            else:
                info(line)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
        trackers, self.trackers = self.trackers, []
        for tracker in trackers:
            tracker.close()
