"""The evaluation stage: generate on held-out prompts, score them, report ``eval/*`` metrics.

Held-out prompts come from ``data.eval_files`` (JSONL/Parquet, read like ``data.train_files``;
the first ``data.eval_samples`` rows) or, for a built-in toy task, from a seed stream of its own
(``random.Random("eval-<trainer.seed>")``), never one of the training streams
(``trainer.seed * 1_000_003 + step``). The same prompts are used at every evaluation, so points
on the curve are comparable. Decoding uses ``rollout.eval_temperature`` (0 = greedy, the default)
and one response per prompt.

Held-out prompts: :func:`verl_bridge.data.prompts.eval_samples`. Generation and scoring are
:class:`verl_bridge.rollout.producer.RolloutProducer`'s, one batch scored at once. Prompts are
split across data-parallel ranks in contiguous chunks; TP ranks of one DP group hold the same chunk. Scores come from where training's come from: the reward function, or the reward
model of a placement (:mod:`verl_bridge.placement`; colocated, or on its own ranks through the
same scoring queue). Sums and counts are all-reduced over the (actor's) DP group, so the metrics
are exact means over all eval prompts whatever the split:

* ``eval/reward_mean``: mean score;
* ``eval/accuracy``: fraction of scores >= 1.0, present only when every score is 0 or 1;
* ``eval/response_length``: mean generated tokens (EOS included);
* ``eval/time_s``: wall time of this evaluation on this rank.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from verl_bridge.distributed.layout import ParallelLayout
from verl_bridge.rollout.producer import RolloutProducer, rollout_seed


def split_for_rank(samples: list, dp_size: int, dp_rank: int) -> list:
    """DP rank ``dp_rank``'s contiguous chunk of ``samples`` (the first ranks take one more when uneven)."""
    base, extra = divmod(len(samples), dp_size)
    start = dp_rank * base + min(dp_rank, extra)
    return samples[start:start + base + (1 if dp_rank < extra else 0)]


def evaluate(producer: RolloutProducer, samples: list[tuple[str, str]], step: int, *, config,
             layout: ParallelLayout) -> dict[str, float]:
    """Evaluate the actor behind ``producer`` on ``samples`` (all ranks' held-out prompts); returns
    ``eval/*`` metrics, identical on every actor rank (sums all-reduced over ``layout.dp_group``)."""
    t0 = time.perf_counter()
    dp_size, dp_rank = layout.dp_size, layout.dp_rank
    mine = split_for_rank(samples, dp_size, dp_rank)
    # reward sum, count, score >= 1 count, response tokens, count of non-binary scores
    sums = torch.zeros(5, dtype=torch.float64)
    if mine:
        seed = rollout_seed(config.trainer.seed, step, dp_rank, evaluation=True)
        batch, scores_t = producer.generate([p for p, _ in mine], [gt for _, gt in mine],
                                            temperature=config.rollout.eval_temperature, seed=seed, pipelined=False)
        scores = scores_t.tolist()
        sums[0] = sum(scores)
        sums[1] = len(scores)
        sums[2] = sum(1 for s in scores if s >= 1.0)
        sums[3] = float(batch.response_mask.sum())
        sums[4] = sum(1 for s in scores if s not in (0.0, 1.0))
    if dp_size > 1:
        dist.all_reduce(sums, group=layout.dp_group)
    total, n, correct, tokens, non_binary = sums.tolist()
    n = max(n, 1.0)
    out = {"eval/reward_mean": total / n, "eval/response_length": tokens / n}
    if non_binary == 0:
        out["eval/accuracy"] = correct / n
    out["eval/time_s"] = time.perf_counter() - t0
    return out


def should_evaluate(config, step: int) -> bool:
    """Step 0 is the pre-training evaluation (``trainer.eval_before_train``); then every ``eval_every``
    steps and at the last step."""
    t = config.trainer
    if step == 0:
        return bool(t.eval_before_train)
    return bool(t.eval_every) and (step % t.eval_every == 0 or step == t.total_steps)
