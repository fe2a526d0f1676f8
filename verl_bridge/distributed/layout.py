"""``ParallelLayout``: this rank's place in the parallel world, with its process groups.

Built once (:func:`verl_bridge.distributed.setup.init_model_parallel` / ``current_layout``) and
passed down: the trainer's DP reductions, evaluation and the placed reward read their groups from
it instead of megatron's globals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class ParallelLayout:
    world_size: int
    rank: int
    tp_size: int
    pp_size: int
    dp_size: int
    tp_rank: int
    pp_rank: int
    dp_rank: int
    device: torch.device
    sequence_parallel: bool = False
    # process groups (None in a layout built by hand, e.g. a world of one)
    tp_group: Any = field(default=None, compare=False, repr=False)
    tp_src_rank: int = field(default=0, compare=False)  # global rank of TP rank 0 of this TP group
    dp_group: Any = field(default=None, compare=False, repr=False)  # the role's DP group under a placement
    ep_size: int = 1  # expert parallelism (MoE): megatron's expert_model_parallel_size
    ep_rank: int = 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0
