"""What a collective timeout names: the collective and the line outside torch that waited on it.

Real gloo timeouts in two processes: rank 1 stays out of the collective (it waits on the store
for rank 0 to finish), so rank 0's collective times out as it does when a peer is stopped.
"""

from datetime import timedelta

import pytest

from tests.dist_utils import run_distributed


def _timeout_text(rank, world_size, how):
    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _get_default_store

    from verl_bridge.distributed.watchdog import _collective

    group = dist.new_group([0, 1], timeout=timedelta(seconds=1))
    store = _get_default_store()
    if rank == 1:
        store.wait(["rank0-done"], timedelta(seconds=60))
        return None
    t = torch.ones(4)
    try:
        if how == "sync":
            dist.all_reduce(t, group=group)
        else:
            handle = dist.all_reduce(t, group=group, async_op=True)
            handle.wait()
    except RuntimeError as exc:
        return _collective(exc), str(exc)
    finally:
        store.set("rank0-done", "1")
    return None


@pytest.mark.parametrize("how", ["async", "sync"])
def test_a_timed_out_collective_is_named_with_its_caller(how):
    text, backend = run_distributed(_timeout_text, 2, how)[0]
    assert "timed out" in backend.lower(), backend
    if how == "async":
        # megatron's TP linear backward waits on its dgrad all-reduce this way: no torch frame names the op
        assert text.startswith("wait() on an async collective (called from "), text
    else:
        assert text.startswith("all_reduce (called from "), text
    assert "test_collective_timeout_names.py:" in text and text.endswith(" _timeout_text)"), text
