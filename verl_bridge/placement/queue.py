"""The asynchronous scoring queue between rollout ranks and the reward group, over torch.distributed.

Only token ids travel, as the seed article has it ("a lightweight queue ... text sequences"):

* a rollout rank (TP rank 0 of an actor DP replica) ``submit``\\ s a finished micro-batch: a header
  ``[kind, rows, cols, prompt_len, truth_bytes]`` then the payload (``input_ids`` and
  ``attention_mask`` [rows, cols] int64, and the ground truths as UTF-8 JSON bytes) with ``isend``;
  it posts the ``irecv`` for the answer at once and goes back to generating;
* the reward group's rank 0 receives, broadcasts the micro-batch inside its TP group, every
  reward rank scores it, and rank 0 ``isend``\\ s back ``[scores..., seconds spent scoring]``
  (float64, so fp32 scores arrive bit-exact);
* a header of kind ``STOP`` ends a sender's stream; the reward ranks loop until every sender
  they serve has stopped.

Messages of one kind between one pair of ranks keep their order (one tag per kind), so no
sequence numbers are needed.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.distributed as dist

DATA, STOP = 1, 0
TAG_HEADER, TAG_IDS, TAG_MASK, TAG_TRUTH, TAG_SCORES = 11, 12, 13, 14, 15
HEADER = 5


@dataclass
class Pending:
    """One submitted micro-batch: its in-flight sends and the buffer its scores arrive in."""

    rows: int
    answer: torch.Tensor
    works: list = field(default_factory=list)
    recv: object = None


class ScoringClient:
    """The rollout side: one per actor DP replica, used on its TP rank 0."""

    def __init__(self, dst: int):
        self.dst = dst

    def submit(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int,
               truths: list[str]) -> Pending:
        ids = input_ids.detach().to("cpu", torch.int64).contiguous()
        mask = attention_mask.detach().to("cpu", torch.int64).contiguous()
        truth = torch.tensor(list(json.dumps(truths).encode("utf-8")), dtype=torch.uint8)
        rows, cols = ids.shape
        header = torch.tensor([DATA, rows, cols, prompt_len, truth.numel()], dtype=torch.int64)
        p = Pending(rows=rows, answer=torch.empty(rows + 1, dtype=torch.float64))
        # tensors stay referenced by Pending until wait(): isend must not see them freed
        p.works = [(dist.isend(header, self.dst, tag=TAG_HEADER), header),
                   (dist.isend(ids, self.dst, tag=TAG_IDS), ids),
                   (dist.isend(mask, self.dst, tag=TAG_MASK), mask),
                   (dist.isend(truth, self.dst, tag=TAG_TRUTH), truth)]
        p.recv = dist.irecv(p.answer, self.dst, tag=TAG_SCORES)
        return p

    @staticmethod
    def collect(p: Pending) -> tuple[torch.Tensor, float]:
        """Block until this micro-batch's scores are back: (fp32 scores [rows], seconds the reward spent)."""
        for w, _ in p.works:
            w.wait()
        p.recv.wait()
        return p.answer[:-1].to(torch.float32), float(p.answer[-1])

    def stop(self) -> None:
        dist.send(torch.tensor([STOP, 0, 0, 0, 0], dtype=torch.int64), self.dst, tag=TAG_HEADER)


def _bcast(t: torch.Tensor, src: int, group) -> torch.Tensor:
    if group is not None:
        dist.broadcast(t, src=src, group=group)
    return t


def serve(scorer: Callable, senders: list[int], *, is_leader: bool, tp_group=None, tp_src: int = 0,
          on_scored: Optional[Callable] = None) -> int:
    """The reward ranks' loop: score micro-batches from ``senders`` until each sends STOP.

    ``scorer(input_ids, attention_mask, prompt_len, truths) -> fp32 scores`` runs on every rank of
    the reward TP group (a TP-sharded reward model needs all of them). Returns the number of
    micro-batches scored.
    """
    active = list(senders)
    replies: list = []
    count = 0
    while active:
        for src in list(active):
            header = torch.zeros(HEADER, dtype=torch.int64)
            if is_leader:
                dist.recv(header, src, tag=TAG_HEADER)
            _bcast(header, tp_src, tp_group)
            kind, rows, cols, prompt_len, nbytes = (int(x) for x in header.tolist())
            if kind == STOP:
                active.remove(src)
                continue
            ids = torch.empty(rows, cols, dtype=torch.int64)
            mask = torch.empty(rows, cols, dtype=torch.int64)
            truth = torch.empty(nbytes, dtype=torch.uint8)
            if is_leader:
                dist.recv(ids, src, tag=TAG_IDS)
                dist.recv(mask, src, tag=TAG_MASK)
                dist.recv(truth, src, tag=TAG_TRUTH)
            _bcast(ids, tp_src, tp_group)
            _bcast(mask, tp_src, tp_group)
            truths = json.loads(bytes(truth.tolist()).decode("utf-8")) if is_leader else None
            t0 = time.perf_counter()
            scores = scorer(ids, mask, prompt_len, truths)
            spent = time.perf_counter() - t0
            count += 1
            if on_scored is not None:
                on_scored(ids, mask, prompt_len, scores)
            if is_leader:
                answer = torch.cat([scores.detach().to("cpu", torch.float64).reshape(-1),
                                    torch.tensor([spent], dtype=torch.float64)])
                replies.append((dist.isend(answer, src, tag=TAG_SCORES), answer))
                replies = [(w, t) for w, t in replies if not w.is_completed()]
    for w, _ in replies:
        w.wait()
    return count
