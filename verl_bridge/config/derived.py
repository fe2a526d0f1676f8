"""Values derived from the config and the world size: pure functions, nothing is written back.

Rollout workers (``data.num_rollout_workers``, the seed article's meaning): with N actor ranks and
rollout tensor parallel size t there are N / t rollout workers, each a generation replica of the
whole model on t consecutive ranks (one TP group). t is the training TP size for the native
engine (the replica is resharded from the training layout, pipeline stages merged: see
:mod:`verl_bridge.rollout.replica`), and ``rollout.tp_size`` (default: the training TP size) for
vLLM, whose ``external_launcher`` cuts TP groups of consecutive ranks from the same world.
``data.num_rollout_workers`` absent (``None``) means "derive it"; given, it must equal N / t.
"""

from __future__ import annotations

from typing import Optional


def rollout_tp_size(cfg, train_tp: Optional[int] = None) -> int:
    """The tensor parallel size of one generation replica (``train_tp``: default ``trainer.args.tp_size``)."""
    r = cfg.rollout
    if r.engine == "vllm" and r.tp_size:
        return int(r.tp_size)
    return int(train_tp or cfg.trainer.args.tp_size)


def rollout_workers(world_size: int, rollout_tp: int) -> int:
    """N / t generation replicas (``world_size``: the actor's ranks)."""
    return world_size // rollout_tp


def rollout_worker_ranks(world_size: int, rollout_tp: int) -> list[list[int]]:
    """The ranks of each rollout worker: ``t`` consecutive ranks each, worker ``r`` from ``r * t``."""
    return [list(range(r * rollout_tp, (r + 1) * rollout_tp)) for r in range(rollout_workers(world_size, rollout_tp))]


def rollout_workers_problem(asked: Optional[int], world_size: int, rollout_tp: int,
                            key: str = "trainer.args.tp_size") -> Optional[str]:
    """Why ``data.num_rollout_workers=asked`` does not fit N / t, or None when it does (or is absent)."""
    if asked is None or not isinstance(asked, int) or rollout_tp < 1 or world_size % rollout_tp:
        return None
    n = rollout_workers(world_size, rollout_tp)
    if asked == n:
        return None
    return (f"data.num_rollout_workers={asked}: world size {world_size} / {key} {rollout_tp} gives {n} generation "
            f"replicas (rollout workers, one per group of {rollout_tp} consecutive ranks); set it to {n} or leave it "
            "out (derived)")


def rollout_worker_lines(world_size: int, rollout_tp: int) -> list[str]:
    """The log lines, the article's way: ``Rollout worker 0 started on ranks 0 & 1 (TP group)``."""
    out = []
    for r, ranks in enumerate(rollout_worker_ranks(world_size, rollout_tp)):
        if len(ranks) == 1:
            out.append(f"Rollout worker {r} started on rank {ranks[0]}")
        else:
            out.append(f"Rollout worker {r} started on ranks {' & '.join(str(x) for x in ranks)} (TP group)")
    return out
