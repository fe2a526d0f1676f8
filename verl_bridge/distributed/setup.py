"""Distributed setup in one place: torch.distributed, megatron's parallel_state, device, seeding.

:func:`init_model_parallel` (or :func:`current_layout`, after a user's ``initialize_megatron``)
returns the :class:`~verl_bridge.distributed.layout.ParallelLayout` with this rank's process groups;
the trainer passes it down, and roles never create groups. Under ``torchrun`` the usual
environment variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) are read; a
plain ``python`` run is a world of one. The backend is gloo on CPU and NCCL on CUDA.
"""

from __future__ import annotations

import os
import random
import socket
import torch
import torch.distributed as dist

from verl_bridge.distributed.layout import ParallelLayout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pick_device() -> torch.device:
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init_distributed(backend: str | None = None, timeout_s: float | None = None) -> None:
    """Initialise torch.distributed from the torchrun environment (or a world of one).

    ``timeout_s``: how long a collective may wait for its peers (default: ``trainer.collective_timeout_s``
    as set by :func:`verl_bridge.distributed.watchdog.set_collective_timeout`, else 600 s)."""
    if dist.is_available() and dist.is_initialized():
        return
    from verl_bridge.distributed.watchdog import collective_timeout_s, start_heartbeat

    timeout_s = collective_timeout_s() if timeout_s is None else timeout_s
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    from datetime import timedelta

    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    if os.environ["WORLD_SIZE"] == "1" and "MASTER_PORT" not in os.environ:
        # a world of one (plain `python`, not torchrun): an in-memory store, no TCP port to race for
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=timedelta(seconds=timeout_s))
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = str(free_port())
    dist.init_process_group(
        backend=backend,
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=timedelta(seconds=timeout_s),
    )
    start_heartbeat()


def init_model_parallel(tp_size: int, pp_size: int, sequence_parallel: bool = False,
                        ep_size: int = 1) -> ParallelLayout:
    """Initialise megatron-core's parallel_state (unless already done) and describe the layout;
    ``ep_size``: megatron's ``expert_model_parallel_size`` (MoE experts split over that many ranks)."""
    from megatron.core import parallel_state as mpu

    init_distributed()
    if not mpu.model_parallel_is_initialized():
        from verl_bridge.distributed.watchdog import collective_timeout_s

        mpu.initialize_model_parallel(
            tensor_model_parallel_size=tp_size, pipeline_model_parallel_size=pp_size,
            **({"expert_model_parallel_size": ep_size} if ep_size > 1 else {}),
            distributed_timeout_minutes=collective_timeout_s() / 60,
        )
    return current_layout(sequence_parallel)


# this rank's role DP group when roles run on separate ranks (verl_bridge.placement.groups): megatron's
# DP groups span the whole world, so the trainer's DP reductions use this one instead
_DP_OVERRIDE: tuple | None = None  # (group, ranks)


def set_data_parallel_group(group, ranks: list[int] | None) -> None:
    global _DP_OVERRIDE
    _DP_OVERRIDE = None if ranks is None else (group, list(ranks))


def data_parallel_group():
    from megatron.core import parallel_state as mpu

    return _DP_OVERRIDE[0] if _DP_OVERRIDE else mpu.get_data_parallel_group()


def data_parallel_world_size() -> int:
    from megatron.core import parallel_state as mpu

    return len(_DP_OVERRIDE[1]) if _DP_OVERRIDE else mpu.get_data_parallel_world_size()


def data_parallel_rank() -> int:
    from megatron.core import parallel_state as mpu

    return _DP_OVERRIDE[1].index(dist.get_rank()) if _DP_OVERRIDE else mpu.get_data_parallel_rank()


def current_layout(sequence_parallel: bool = False) -> ParallelLayout:
    from megatron.core import parallel_state as mpu

    return ParallelLayout(
        world_size=dist.get_world_size(),
        rank=dist.get_rank(),
        tp_size=mpu.get_tensor_model_parallel_world_size(),
        pp_size=mpu.get_pipeline_model_parallel_world_size(),
        dp_size=data_parallel_world_size(),
        tp_rank=mpu.get_tensor_model_parallel_rank(),
        pp_rank=mpu.get_pipeline_model_parallel_rank(),
        dp_rank=data_parallel_rank(),
        device=pick_device(),
        sequence_parallel=sequence_parallel,
        tp_group=mpu.get_tensor_model_parallel_group(),
        tp_src_rank=mpu.get_tensor_model_parallel_src_rank(),
        dp_group=data_parallel_group(),
        ep_size=mpu.get_expert_model_parallel_world_size(),
        ep_rank=mpu.get_expert_model_parallel_rank(),
    )


def seed_everything(seed: int) -> None:
    """Seed python, torch (CPU) and, when CUDA exists, megatron's CUDA RNG tracker."""
    random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        from megatron.core import tensor_parallel

        tensor_parallel.model_parallel_cuda_manual_seed(seed)


def destroy() -> None:
    from megatron.core import parallel_state as mpu

    from verl_bridge.distributed.watchdog import stop_heartbeat

    stop_heartbeat()
    set_data_parallel_group(None, None)
    if mpu.model_parallel_is_initialized():
        mpu.destroy_model_parallel()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
