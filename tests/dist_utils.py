"""Run a function in N real processes over gloo (CPU) for distributed tests.

Workers start from a fork server (see ``_context``), with the parent's environment, directory and
stdout/stderr as they are at the call. Each worker gets RANK/WORLD_SIZE/MASTER_* in its environment, initialises torch.distributed with
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


class _ParentStdio:
    """The parent's stdout and stderr as they are when a worker starts. A fork server's child
    inherits the server's descriptors (from the server's start, in some earlier test); pickled at
    the worker's start, this passes the parent's fds 1 and 2 to the child (multiprocessing's own
    fd passing), which puts them over its own, as a spawned child inherits them (so pytest's
    ``capfd`` sees what the workers print)."""

    def __reduce__(self):
        from multiprocessing import reduction

        return _attach_stdio, (reduction.DupFd(1), reduction.DupFd(2))


def _attach_stdio(out, err):
    for wrapper, fd in ((out, 1), (err, 2)):
        new = wrapper.detach()
        if new != fd:  # spawn passes the fd under its own number; the fork server sends a new one
            os.dup2(new, fd)
            os.close(new)


def _worker(rank, world_size, port, fn, args, queue, environ, cwd, stdio=None):
    # a fork server's child starts with the server's environment and directory (from its start):
    # take the parent's as they are now, as a spawned process would
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
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


_CTX = None
# imported once by the fork server; a module that fails to import there is skipped (then imported
# by the worker that needs it, as with spawn)
_PRELOAD = ["torch", "megatron.core", "megatron.core.parallel_state", "verl_bridge.distributed", "tests.dist_utils"]


def _context():
    """Workers fork from a fork server that imported torch and megatron-core once: a clean process
    (no pytest state, no process group, no threads), as with spawn, without each worker importing
    them again (~4 s of CPU per worker; on 2 cores tests/runtime/test_training_math.py and
    tests/layout/test_sp_norms.py took 135 s with spawn and 12 s with the fork server under the
    same load). ``VB_TEST_START_METHOD=spawn`` goes back to spawn."""
    global _CTX
    if _CTX is None:
        method = os.environ.get("VB_TEST_START_METHOD", "forkserver")
        _CTX = mp.get_context(method)
        if method == "forkserver":
            _CTX.set_forkserver_preload(_PRELOAD)
    return _CTX


def run_distributed(fn, world_size: int, *args, timeout: float = 300.0) -> list:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo processes; return results by rank."""
    from verl_bridge.distributed import free_port

    ctx = _context()
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world_size, port, fn, args, queue, dict(os.environ), os.getcwd(), _ParentStdio())) for r in range(world_size)]
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
