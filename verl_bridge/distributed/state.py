"""megatron-core's parallel state as it is now, read in one place.

Code that can run with or without megatron's groups (the weight exporter, HF model building,
checkpoint readers, log-prob helpers) asks :func:`model_parallel_state`, which returns None when
megatron-core is not installed or its parallel state is not initialised (a world of one), instead
of each module calling ``parallel_state`` getters and swallowing whatever they raise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch.distributed as dist


@dataclass(frozen=True)
class ModelParallelState:
    rank: int
    tp_size: int
    tp_rank: int
    pp_size: int
    pp_rank: int
    dp_rank: int
    pp_ranks: tuple[int, ...]  # global ranks of this rank's pipeline group, in stage order
    tp_group: Any = field(default=None, compare=False, repr=False)
    pp_group: Any = field(default=None, compare=False, repr=False)
    model_parallel_group: Any = field(default=None, compare=False, repr=False)  # TP x PP
    ep_size: int = 1  # expert parallelism (MoE): megatron's expert_model_parallel_size
    ep_rank: int = 0
    edp_rank: int = 0  # rank in the expert-data-parallel group (ranks holding the same experts)
    ep_group: Any = field(default=None, compare=False, repr=False)  # megatron's expert-model-parallel group
    etp_size: int = 1  # expert tensor parallelism (megatron's expert_tensor_parallel_size)


def model_parallel_state() -> Optional[ModelParallelState]:
    """This rank's megatron parallel state, or None when megatron's groups are not set up."""
    try:
        from megatron.core import parallel_state as mpu
    except ImportError:  # megatron-core not installed: nothing can have set up its groups
        return None
    if not (dist.is_available() and dist.is_initialized()) or not mpu.model_parallel_is_initialized():
        return None
    pp_group = mpu.get_pipeline_model_parallel_group()
    pp_size = mpu.get_pipeline_model_parallel_world_size()
    return ModelParallelState(
        rank=dist.get_rank(),
        tp_size=mpu.get_tensor_model_parallel_world_size(), tp_rank=mpu.get_tensor_model_parallel_rank(),
        pp_size=pp_size, pp_rank=mpu.get_pipeline_model_parallel_rank(),
        dp_rank=mpu.get_data_parallel_rank(),
        pp_ranks=tuple(dist.get_process_group_ranks(pp_group)) if pp_size > 1 else (dist.get_rank(),),
        tp_group=mpu.get_tensor_model_parallel_group(), pp_group=pp_group,
        model_parallel_group=mpu.get_model_parallel_group(),
        ep_size=mpu.get_expert_model_parallel_world_size(), ep_rank=mpu.get_expert_model_parallel_rank(),
        edp_rank=mpu.get_expert_data_parallel_rank(),
        ep_group=mpu.get_expert_model_parallel_group(),
        etp_size=mpu.get_expert_tensor_parallel_world_size(),
    )
