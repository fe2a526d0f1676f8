"""Run a function in N real processes over gloo (CPU) for distributed tests.

Each worker gets RANK/WORLD_SIZE/MASTER_* in its environment, initialises torch.distributed with
gloo, runs ``fn(rank, world_size, *args)``, and puts its return value (which must be picklable)
on a queue (pickled by value, so nothing depends on the worker staying alive). Exceptions in a worker are re-raised in the parent with the worker's traceback.
"""

from __future__ import annotations

import os
import pickle
import traceback

import torch.multiprocessing as mp


# what torchrun / an in-process world of one leave in os.environ (verl_bridge.distributed sets them)
DIST_ENV_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID")


def clean_env(**extra) -> dict:
    """``os.environ`` as a plain shell would have it for a launched command: without the
    torch.distributed variables that earlier in-process runs of this pytest process left behind."""
    env = {k: v for k, v in os.environ.items() if k not in DIST_ENV_VARS}
    env.update(extra)
    return env


def _worker(rank, world_size, port, fn, args, queue):
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
    )
    import torch

    torch.set_num_threads(1)
    try:
        from verl_bridge.distributed import destroy, init_distributed

        init_distributed("gloo")
        result = fn(rank, world_size, *args)
        # plain pickle (tensors by value): torch's queue would pass tensors as shared-memory handles
        # that die with this process, and a fast exit raced the parent's read (ConnectionResetError)
        queue.put((rank, "ok", pickle.dumps(result)))
        destroy()
    except BaseException:  # noqa: BLE001 - reported to the parent
        queue.put((rank, "error", traceback.format_exc()))


def run_distributed(fn, world_size: int, *args, timeout: float = 300.0) -> list:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo processes; return results by rank."""
    from verl_bridge.distributed import free_port

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world_size, port, fn, args, queue)) for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, object] = {}
    errors = []
    try:
        for _ in range(world_size):
            rank, status, payload = queue.get(timeout=timeout)
            if status == "error":
                errors.append(f"rank {rank}:\n{payload}")
                break
            results[rank] = pickle.loads(payload)
    finally:
        for p in procs:
            p.join(timeout=5 if errors else 60)
            if p.is_alive():
                p.kill()
    if errors:
        raise RuntimeError("distributed worker failed\n" + "\n".join(errors))
    return [results[r] for r in range(world_size)]
