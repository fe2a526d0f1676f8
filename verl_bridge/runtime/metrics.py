"""Run outputs: the seed article's console lines, metrics.jsonl, and a progress bar on a TTY."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Optional


def info(msg: str) -> None:
    print(f"[INFO] {msg}", flush=True)


def warn(msg: str) -> None:
    print(f"[WARN] {msg}", flush=True)


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
        """On resume: keep the rows of steps <= ``step`` (later ones belong to the lost tail)."""
        if not self.path or not os.path.exists(self.path):
            return
        keep = []
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                if line.strip() and json.loads(line)["step"] <= step:
                    keep.append(line)
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(keep)
        os.replace(tmp, self.path)

    def reset(self) -> None:
        """A fresh run: start metrics.jsonl empty."""
        if self.path and os.path.exists(self.path):
            os.remove(self.path)

    def log(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        record = {"step": step, **metrics, "time": time.time()}
        if self.path:
            with open(self.path, "a", encoding="utf-8") as f:
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
