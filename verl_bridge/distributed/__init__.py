"""Distributed setup in one place: the parallel layout and process groups, built once, passed down.

* :mod:`.layout`: :class:`ParallelLayout` (sizes, ranks, device, TP and DP groups of this rank);
* :mod:`.setup`: torch.distributed and megatron's parallel_state initialisation, the role DP group
  of a placement, device choice, seeding, teardown;
* :mod:`.state`: :func:`model_parallel_state`, megatron's state as it is now (None without groups)
  for code that runs with and without them.
"""

from verl_bridge.distributed.layout import ParallelLayout
from verl_bridge.distributed.setup import (
    current_layout,
    data_parallel_group,
    data_parallel_rank,
    data_parallel_world_size,
    destroy,
    free_port,
    init_distributed,
    init_model_parallel,
    pick_device,
    seed_everything,
    set_data_parallel_group,
)
from verl_bridge.distributed.state import ModelParallelState, model_parallel_state

__all__ = [
    "ModelParallelState", "ParallelLayout", "current_layout", "data_parallel_group", "data_parallel_rank",
    "data_parallel_world_size", "destroy", "free_port", "init_distributed", "init_model_parallel",
    "model_parallel_state", "pick_device", "seed_everything", "set_data_parallel_group",
]
