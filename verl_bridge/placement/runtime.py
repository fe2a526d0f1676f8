"""What :class:`~verl_bridge.runtime.trainer.MegatronTrainer` calls when the reward is placed.

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

from verl_bridge.placement.groups import RoleLayout, role_layout
from verl_bridge.placement.queue import ScoringClient, serve
from verl_bridge.placement.scorer import build_scorer
from verl_bridge.rollout.base import RolloutBatch, SamplingParams
from verl_bridge.runtime.batch import Experience


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
    )


class Placement:
    def __init__(self, trainer, roles: Optional[RoleLayout], scorer: Optional[Callable]):
        self.trainer = trainer
        self.roles = roles
        self.scorer = scorer
        self.timings: dict[str, float] = {}
        # the last step's scored micro-batches on this rank: (input_ids, attention_mask, prompt_len, scores)
        self.scored: list[tuple[torch.Tensor, torch.Tensor, int, torch.Tensor]] = []
        self._client = None
        if roles is not None and roles.role == "actor" and roles.is_leader:
            self._client = ScoringClient(roles.reward_leader_for(roles.dp_rank))

    @classmethod
    def from_trainer(cls, trainer) -> Optional["Placement"]:
        """None when every role is colocated and the reward is a function (the trainer's own path)."""
        roles = role_layout()
        if roles is not None and dist.get_rank() == 0:
            from verl_bridge.placement.spec import layout_lines
            from verl_bridge.runtime.metrics import info

            for line in layout_lines(trainer.config, dist.get_world_size())[:2]:
                info(" ".join(line.split()))
        if roles is None:
            if trainer.config.model.reward.type != "model":
                return None
            return cls(trainer, None, build_scorer(trainer))
        return cls(trainer, roles, build_scorer(trainer) if roles.role == "reward" else None)

    @property
    def is_reward_rank(self) -> bool:
        return self.roles is not None and self.roles.role == "reward"

    # ------------------------------------------------------------------ actor ranks
    def _params(self) -> SamplingParams:
        cfg, tok = self.trainer.config, self.trainer.tokenizer
        return SamplingParams(
            max_new_tokens=cfg.data.max_response_length, temperature=cfg.rollout.temperature,
            top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k,
            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        )

    def rollout(self, step: int) -> Experience:
        t = self.trainer
        cfg = t.config
        ids, _, truths = t._prompts_for_step(step)
        params = self._params()
        seed = (cfg.trainer.seed * 7919 + step) * 131 + t.layout.dp_rank
        t0 = time.perf_counter()
        if self.roles is None:  # colocated reward model: one batch, scored here
            batch = t.engine.generate(ids, params, seed=seed)
            t1 = time.perf_counter()
            scores = self.scorer(batch.input_ids, batch.attention_mask, batch.prompt_ids.shape[1], truths)
            spent = time.perf_counter() - t1
            self.scored = [(batch.input_ids, batch.attention_mask, batch.prompt_ids.shape[1], scores)]
            self.timings = {"time_rollout_s": t1 - t0, "time_reward_s": spent, "time_reward_wait_s": spent}
        else:
            mb = self.roles.reward.micro_batch_size or cfg.algorithm.micro_batch_size
            batches, pending = [], []
            for k, start in enumerate(range(0, len(ids), mb)):
                b = t.engine.generate(ids[start:start + mb], params, seed=seed * 1009 + k)
                batches.append(b)
                if self._client is not None:  # the next micro-batch is generated while this one is scored
                    pending.append(self._client.submit(b.input_ids, b.attention_mask, b.prompt_ids.shape[1],
                                                       truths[start:start + mb]))
            t1 = time.perf_counter()
            parts, spent_t = [], torch.zeros(1, dtype=torch.float64)
            for p in pending:
                s, sec = ScoringClient.collect(p)
                parts.append(s)
                spent_t += sec
            scores = torch.cat(parts) if parts else torch.zeros(len(ids), dtype=torch.float32)
            if self.roles.tp_size > 1:  # TP ranks hold identical samples: give them rank 0's scores
                from megatron.core import parallel_state as mpu

                src, group = mpu.get_tensor_model_parallel_src_rank(), mpu.get_tensor_model_parallel_group()
                dist.broadcast(scores, src=src, group=group)
                dist.broadcast(spent_t, src=src, group=group)
            wait = time.perf_counter() - t1
            self.scored, off = [], 0
            for b in batches:
                n = b.input_ids.shape[0]
                self.scored.append((b.input_ids, b.attention_mask, b.prompt_ids.shape[1], scores[off:off + n]))
                off += n
            batch = concat_batches(batches, params.pad_token_id)
            self.timings = {"time_rollout_s": t1 - t0, "time_reward_s": float(spent_t), "time_reward_wait_s": wait}
        return Experience(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, prompt_len=batch.prompt_ids.shape[1],
            response_ids=batch.response_ids, response_mask=batch.response_mask.float(), scores=scores.to(t.device),
        )

    def close(self) -> None:
        """Actor ranks, at the end of training (or on an error): tell the reward group to stop."""
        if self._client is not None:
            self._client.stop()
            self._client = None

    # ------------------------------------------------------------------ reward ranks
    def serve(self) -> list:
        from megatron.core import parallel_state as mpu

        r = self.roles
        group = mpu.get_tensor_model_parallel_group() if r.tp_size > 1 else None
        self.served = serve(self.scorer, r.senders_of(r.dp_rank), is_leader=r.is_leader, tp_group=group,
                            tp_src=mpu.get_tensor_model_parallel_src_rank())
        return []
