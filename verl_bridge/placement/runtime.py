"""The reward source of :mod:`verl_bridge.rollout.producer` when the reward is placed.

* actor ranks, separate reward group: the rollout is split into micro-batches (``placement.
  micro_batch_size``, default ``algorithm.micro_batch_size``); each finished micro-batch goes to
  the reward group through the queue while the next one is generated, and the scores are
  collected before advantages are computed;
* reward ranks: build the scorer and :func:`verl_bridge.placement.queue.serve` until stopped;
* colocated ``type: model``: the reward model scores the whole batch on the actor's ranks.

Step timings (added to metrics.jsonl): ``time_rollout_s`` (generation), ``time_reward_s``
(seconds the reward ranks spent scoring, sent back with the scores), ``time_reward_wait_s``
(seconds the actor ranks waited for scores after generating). Overlap shows as reward > wait.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

import torch
import torch.distributed as dist

from verl_bridge.distributed.layout import ParallelLayout
from verl_bridge.placement.groups import RoleLayout, role_layout
from verl_bridge.placement.queue import ScoringClient, serve
from verl_bridge.placement.scorer import build_scorer
from verl_bridge.rollout.base import RolloutBatch, SamplingParams


def concat_batches(batches: list[RolloutBatch], pad_id: int) -> RolloutBatch:
    """Micro-batches of different widths -> one batch (prompts left-padded, responses right-padded)."""
    plen = max(b.prompt_ids.shape[1] for b in batches)
    rlen = max(b.response_ids.shape[1] for b in batches)

    def pad(t, width, left, value):
        extra = width - t.shape[1]
        if extra == 0:
            return t
        fill = torch.full((t.shape[0], extra), value, dtype=t.dtype, device=t.device)
        return torch.cat([fill, t] if left else [t, fill], dim=1)

    return RolloutBatch(
        prompt_ids=torch.cat([pad(b.prompt_ids, plen, True, pad_id) for b in batches]),
        prompt_mask=torch.cat([pad(b.prompt_mask, plen, True, 0) for b in batches]),
        response_ids=torch.cat([pad(b.response_ids, rlen, False, pad_id) for b in batches]),
        response_mask=torch.cat([pad(b.response_mask, rlen, False, 0) for b in batches]),
        log_probs=(torch.cat([pad(b.log_probs, rlen, False, 0.0) for b in batches])
                   if all(b.log_probs is not None for b in batches) else None),
    )


class Placement:
    """The reward source of a run whose reward is placed (see :mod:`verl_bridge.rollout.producer`).

    ``roles`` is None for a reward model colocated on the actor's ranks; otherwise this rank's
    :class:`~verl_bridge.placement.groups.RoleLayout` (actor or reward group). ``scorer`` is built on
    the ranks that score: the reward group, or every rank when colocated.
    """

    def __init__(self, config, layout: ParallelLayout, roles: Optional[RoleLayout], scorer: Optional[Callable]):
        self.config = config
        self.layout = layout
        self.roles = roles
        self.scorer = scorer
        self.timings: dict[str, float] = {}
        # the last step's scored micro-batches on this rank: (input_ids, attention_mask, prompt_len, scores)
        self.scored: list[tuple[torch.Tensor, torch.Tensor, int, torch.Tensor]] = []
        self.served = 0
        self.client: Optional[ScoringClient] = None  # this actor group's TP leader sends to the reward group
        if roles is not None and roles.role == "actor" and roles.is_leader:
            self.client = ScoringClient(roles.reward_leader_for(roles.dp_rank))

    @classmethod
    def from_config(cls, config, layout: ParallelLayout, build_scorer: Callable[[], Callable]) -> Optional["Placement"]:
        """None when every role is colocated and the reward is a function (the producer's own path).

        ``build_scorer()`` is called only on the ranks that score.
        """
        roles = role_layout()
        if roles is not None and dist.get_rank() == 0:
            from verl_bridge.placement.spec import layout_lines
            from verl_bridge.common.log import info

            for line in layout_lines(config, dist.get_world_size())[:2]:
                info(" ".join(line.split()))
        if roles is None:
            if config.model.reward.type != "model":
                return None
            return cls(config, layout, None, build_scorer())
        return cls(config, layout, roles, build_scorer() if roles.role == "reward" else None)

    @property
    def is_reward_rank(self) -> bool:
        return self.roles is not None and self.roles.role == "reward"

    # ------------------------------------------------------------------ actor ranks
    def _share_over_tp(self, *tensors: torch.Tensor) -> None:
        """TP ranks hold identical samples: give them the TP leader's scores."""
        if self.roles is not None and self.roles.tp_size > 1:
            for t in tensors:
                dist.broadcast(t, src=self.layout.tp_src_rank, group=self.layout.tp_group)

    def score(self, batch: RolloutBatch, truths: list) -> torch.Tensor:
        """Scores of one finished batch (evaluation): colocated, or one request to the reward group."""
        plen = batch.prompt_ids.shape[1]
        if self.roles is None:  # a reward model colocated on these ranks
            return self.scorer(batch.input_ids, batch.attention_mask, plen, truths)
        scores = torch.zeros(len(truths), dtype=torch.float32)
        if self.client is not None:
            scores, _ = ScoringClient.collect(self.client.submit(batch.input_ids, batch.attention_mask, plen, truths))
            scores = scores.float()
        self._share_over_tp(scores)
        return scores

    def generate_and_score(self, engine, ids: list[list[int]], truths: list, params: SamplingParams,
                           seed: int) -> tuple[RolloutBatch, torch.Tensor]:
        """The training rollout; with a reward group, each micro-batch is scored while the next is generated."""
        t0 = time.perf_counter()
        if self.roles is None:  # colocated reward model: one batch, scored here
            batch = engine.generate(ids, params, seed=seed)
            t1 = time.perf_counter()
            scores = self.scorer(batch.input_ids, batch.attention_mask, batch.prompt_ids.shape[1], truths)
            spent = time.perf_counter() - t1
            self.scored = [(batch.input_ids, batch.attention_mask, batch.prompt_ids.shape[1], scores)]
            self.timings = {"time_rollout_s": t1 - t0, "time_reward_s": spent, "time_reward_wait_s": spent}
            return batch, scores
        mb = self.roles.reward.micro_batch_size or self.config.algorithm.micro_batch_size
        batches, pending = [], []
        for k, start in enumerate(range(0, len(ids), mb)):
            b = engine.generate(ids[start:start + mb], params, seed=seed * 1009 + k)
            batches.append(b)
            if self.client is not None:  # the next micro-batch is generated while this one is scored
                pending.append(self.client.submit(b.input_ids, b.attention_mask, b.prompt_ids.shape[1],
                                                  truths[start:start + mb]))
        t1 = time.perf_counter()
        parts, spent_t = [], torch.zeros(1, dtype=torch.float64)
        for p in pending:
            s, sec = ScoringClient.collect(p)
            parts.append(s)
            spent_t += sec
        scores = torch.cat(parts) if parts else torch.zeros(len(ids), dtype=torch.float32)
        self._share_over_tp(scores, spent_t)
        wait = time.perf_counter() - t1
        self.scored, off = [], 0
        for b in batches:
            n = b.input_ids.shape[0]
            self.scored.append((b.input_ids, b.attention_mask, b.prompt_ids.shape[1], scores[off:off + n]))
            off += n
        self.timings = {"time_rollout_s": t1 - t0, "time_reward_s": float(spent_t), "time_reward_wait_s": wait}
        return concat_batches(batches, params.pad_token_id), scores

    def close(self) -> None:
        """Actor ranks, at the end of training (or on an error): tell the reward group to stop."""
        if self.client is not None:
            self.client.stop()
            self.client = None

    # ------------------------------------------------------------------ reward ranks
    def serve(self) -> list:
        r = self.roles
        group = self.layout.tp_group if r.tp_size > 1 else None
        self.served = serve(self.scorer, r.senders_of(r.dp_rank), is_leader=r.is_leader, tp_group=group,
                            tp_src=self.layout.tp_src_rank)
        return []
