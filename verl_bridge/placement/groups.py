"""Split the torchrun world into role groups: the actor on ranks ``0..A-1``, the reward on ``A..W-1``.

megatron-core's ``parallel_state`` is global, so it is initialised once over the whole world with
the actor's TP size (:func:`verl_bridge.distributed.init_model_parallel`). Its TP groups are blocks
of consecutive ranks, so with the reward's TP size equal to the actor's, every TP group lies inside
one role group and each role builds its models with megatron's own TP group. Megatron's DP groups
span both roles, so each role gets its own DP group (``dist.new_group``, created on every rank in
the same order) and :func:`verl_bridge.distributed.set_data_parallel_group` points the trainer's DP
reductions at the actor's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch.distributed as dist

from verl_bridge.placement.spec import RoleGroup, reward_group


@dataclass(frozen=True)
class RoleLayout:
    """This rank's place in a split world."""

    role: str  # "actor" | "reward"
    reward: RoleGroup
    actor_ranks: int
    tp_size: int
    tp_rank: int
    dp_rank: int  # inside this rank's role group
    actor_leaders: tuple[int, ...]  # TP rank 0 of each actor DP replica (global ranks)
    reward_leaders: tuple[int, ...]  # TP rank 0 of each reward DP replica

    @property
    def is_leader(self) -> bool:
        return self.tp_rank == 0

    @property
    def reward_dp(self) -> int:
        return len(self.reward_leaders)

    def reward_leader_for(self, actor_dp_rank: int) -> int:
        """Actor DP replica d sends to reward replica d mod (reward DP)."""
        return self.reward_leaders[actor_dp_rank % self.reward_dp]

    def senders_of(self, reward_dp_rank: int) -> list[int]:
        return [leader for d, leader in enumerate(self.actor_leaders) if d % self.reward_dp == reward_dp_rank]


_STATE: Optional[RoleLayout] = None


def role_layout() -> Optional[RoleLayout]:
    """This rank's role layout, or None when every role is colocated."""
    return _STATE


def apply_placement(cfg, layout):
    """After megatron's world-wide init: create the role DP groups; return this rank's ParallelLayout."""
    global _STATE
    from megatron.core import parallel_state as mpu

    from verl_bridge.distributed import current_layout, set_data_parallel_group

    g = reward_group(cfg, layout.world_size)
    if g is None:
        _STATE = None
        return layout
    world, tp, rank = layout.world_size, layout.tp_size, layout.rank
    if layout.pp_size != 1 or g.tp_size != tp or g.first % tp or g.ranks % tp:
        raise RuntimeError(f"model.reward.placement={cfg.model.reward.placement!r} does not fit the world of {world} "
                           f"ranks with TP={tp}, PP={layout.pp_size} (run `verl-bridge validate` for details)")
    tp_ranks = dist.get_process_group_ranks(mpu.get_tensor_model_parallel_group())
    start = rank - rank % tp
    if tp_ranks != list(range(start, start + tp)):
        raise RuntimeError(f"megatron's TP group of rank {rank} is {tp_ranks}; a separate reward group needs TP "
                           "groups of consecutive ranks (megatron-core's default rank order tp-cp-ep-dp-pp)")
    groups = {}
    for first, last, role in ((0, g.first, "actor"), (g.first, world, "reward")):
        for t in range(tp):  # every rank creates every group, in the same order
            ranks = list(range(first + t, last, tp))
            groups[(role, t)] = (dist.new_group(ranks), ranks)
    role = "reward" if rank >= g.first else "actor"
    tp_rank = rank % tp
    group, ranks = groups[(role, tp_rank)]
    set_data_parallel_group(group, ranks)
    _STATE = RoleLayout(role=role, reward=g, actor_ranks=g.first, tp_size=tp, tp_rank=tp_rank,
                        dp_rank=ranks.index(rank), actor_leaders=tuple(range(0, g.first, tp)),
                        reward_leaders=tuple(range(g.first, world, tp)))
    return current_layout(layout.sequence_parallel)


def reset() -> None:
    global _STATE
    _STATE = None
