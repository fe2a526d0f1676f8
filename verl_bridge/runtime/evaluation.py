"""The evaluation stage: generate on held-out prompts, score them, report ``eval/*`` metrics.

Held-out prompts come from ``data.eval_files`` (JSONL/Parquet, read like ``data.train_files``;
the first ``data.eval_samples`` rows) or, for a built-in toy task, from a seed stream of its own
(``random.Random("eval-<trainer.seed>")``), never one of the training streams
(``trainer.seed * 1_000_003 + step``). The same prompts are used at every evaluation, so points
on the curve are comparable. Decoding uses ``rollout.eval_temperature`` (0 = greedy, the default)
and one response per prompt.

Prompts are split across data-parallel ranks in contiguous chunks; TP ranks of one DP group hold
the same chunk. Scores come from where training's come from: the reward function, or the reward
model of a placement (:mod:`verl_bridge.placement`; colocated, or on its own ranks through the
same scoring queue). Sums and counts are all-reduced over the (actor's) DP group, so the metrics
are exact means over all eval prompts whatever the split:

* ``eval/reward_mean``: mean score;
* ``eval/accuracy``: fraction of scores >= 1.0, present only when every score is 0 or 1;
* ``eval/response_length``: mean generated tokens (EOS included);
* ``eval/time_s``: wall time of this evaluation on this rank.
"""

from __future__ import annotations

import random
import time

import torch
import torch.distributed as dist


def eval_samples(trainer) -> list[tuple[str, str]]:
    """All held-out (prompt, ground truth) pairs of one evaluation, identical on every rank."""
    cfg = trainer.config
    cached = getattr(trainer, "_eval_samples", None)
    if cached is not None:
        return cached
    n = cfg.data.eval_samples
    if cfg.data.eval_files:
        from verl_bridge.data import load_prompt_file

        samples = load_prompt_file(cfg, cfg.data.eval_files, key="data.eval_files")[:n]
    elif trainer.task is not None:
        samples = trainer.task.sample(random.Random(f"eval-{cfg.trainer.seed}"), n)
    else:
        raise RuntimeError("evaluation needs held-out prompts: set data.eval_files (a JSONL/Parquet file)")
    trainer._eval_samples = samples
    return samples


def _my_chunk(samples: list, dp_size: int, dp_rank: int) -> list:
    base, extra = divmod(len(samples), dp_size)
    start = dp_rank * base + min(dp_rank, extra)
    return samples[start:start + base + (1 if dp_rank < extra else 0)]


def _scores(trainer, batch, texts: list[str], truths: list) -> list[float]:
    pl = getattr(trainer, "placement", None)
    if pl is None:
        return [float(trainer.reward_fn(t, gt)) for t, gt in zip(texts, truths)]
    plen = batch.prompt_ids.shape[1]
    if pl.roles is None:  # a reward model colocated on these ranks
        return [float(x) for x in pl.scorer(batch.input_ids, batch.attention_mask, plen, truths)]
    # a reward group on its own ranks: the TP leader submits to the scoring queue, its TP ranks share the result
    from verl_bridge.placement.queue import ScoringClient

    scores = torch.zeros(len(truths), dtype=torch.float32)
    if pl._client is not None:
        scores, _ = ScoringClient.collect(pl._client.submit(batch.input_ids, batch.attention_mask, plen, truths))
        scores = scores.float()
    if pl.roles.tp_size > 1:
        from megatron.core import parallel_state as mpu

        dist.broadcast(scores, src=mpu.get_tensor_model_parallel_src_rank(),
                       group=mpu.get_tensor_model_parallel_group())
    return scores.tolist()


def evaluate(trainer, step: int) -> dict[str, float]:
    """Evaluate the actor as it is now; returns ``eval/*`` metrics (identical on every actor rank)."""
    from verl_bridge.parallel import data_parallel_group, data_parallel_rank, data_parallel_world_size
    from verl_bridge.rollout.base import SamplingParams

    t0 = time.perf_counter()
    cfg = trainer.config
    dp_size, dp_rank = data_parallel_world_size(), data_parallel_rank()
    mine = _my_chunk(eval_samples(trainer), dp_size, dp_rank)
    # reward sum, count, score >= 1 count, response tokens, count of non-binary scores
    sums = torch.zeros(5, dtype=torch.float64)
    if mine:
        tok = trainer.tokenizer
        ids = [tok.encode(p)[-cfg.data.max_prompt_length:] for p, _ in mine]
        params = SamplingParams(
            max_new_tokens=cfg.data.max_response_length, temperature=cfg.rollout.eval_temperature,
            top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k,
            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        )
        seed = (cfg.trainer.seed * 7919 + 1_000_000 + step) * 131 + dp_rank
        batch = trainer.engine.generate(ids, params, seed=seed)
        texts = [tok.decode(r[m.bool()].tolist()) for r, m in zip(batch.response_ids, batch.response_mask)]
        scores = _scores(trainer, batch, texts, [gt for _, gt in mine])
        sums[0] = sum(scores)
        sums[1] = len(scores)
        sums[2] = sum(1 for s in scores if s >= 1.0)
        sums[3] = float(batch.response_mask.sum())
        sums[4] = sum(1 for s in scores if s not in (0.0, 1.0))
    if dp_size > 1:
        dist.all_reduce(sums, group=data_parallel_group())
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
