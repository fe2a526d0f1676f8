"""Which prompts a step trains on, and which held-out prompts an evaluation uses.

Prompts come from a built-in task (``data.task``, drawn from its own generator) or from the rows
of ``data.train_files`` (drawn uniformly with replacement). Each step's draw is a pure function of
``trainer.seed`` and the step (``random.Random(seed * 1_000_003 + step)``), so a resumed run sees
the prompts it would have seen. A DP rank keeps its contiguous share of the step's prompts, each
repeated ``algorithm.group_size`` times.
"""

from __future__ import annotations

import random
from typing import Optional

from verl_bridge.data.files import load_prompt_file


class PromptSource:
    """``task`` (a built-in task) or, when it is None, the rows of ``config.data.train_files``."""

    def __init__(self, config, task=None):
        self.config = config
        self.task = task
        self.rows: Optional[list[tuple[str, str]]] = None  # data.train_files, read on first use

    def sample(self, rng: random.Random, n: int) -> list[tuple[str, str]]:
        if self.task is not None:
            return self.task.sample(rng, n)
        if self.rows is None:
            self.rows = load_prompt_file(self.config)
        return [self.rows[rng.randrange(len(self.rows))] for _ in range(n)]

    def for_step(self, step: int, dp_rank: int, dp_size: int) -> tuple[list[str], list[str]]:
        """This DP rank's (prompts, ground truths) of ``step``, each repeated ``group_size`` times."""
        cfg = self.config
        rng = random.Random(cfg.trainer.seed * 1_000_003 + step)
        samples = self.sample(rng, cfg.data.rollout_batch_size)
        per_rank = cfg.data.rollout_batch_size // dp_size
        mine = samples[dp_rank * per_rank:(dp_rank + 1) * per_rank]
        g = cfg.algorithm.group_size
        return [p for p, _ in mine for _ in range(g)], [t for _, t in mine for _ in range(g)]


def eval_samples(config, task=None) -> list[tuple[str, str]]:
    """All held-out (prompt, ground truth) pairs of one evaluation, identical on every rank.

    The first ``data.eval_samples`` rows of ``data.eval_files``, or, for a built-in task, a seed
    stream of its own (``random.Random("eval-<trainer.seed>")``) that no training step draws from.
    """
    n = config.data.eval_samples
    if config.data.eval_files:
        return load_prompt_file(config, config.data.eval_files, key="data.eval_files")[:n]
    if task is not None:
        return task.sample(random.Random(f"eval-{config.trainer.seed}"), n)
    raise RuntimeError("evaluation needs held-out prompts: set data.eval_files (a JSONL/Parquet file)")
