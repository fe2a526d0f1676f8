"""megatron-core's own weight refit (``megatron.core.resharding.swap_model_weights``) on the CPU.

``swap_model_weights(src, dst, refit_method)`` copies one model's weights into another of a
different parallel layout (TP=2 -> TP=1, ...): megatron-core plans the slices from the two models'
``pg_collection`` and hands the sends / receives to a ``CopyService``. Its ``"gloo"`` service
(0.16-0.19) stages through CUDA: ``torch.cuda.Stream()`` in ``__init__`` and, from 0.18, pinned
memory; none of that exists on a CPU-only machine. :class:`CpuGlooCopyService` is a
``CopyService`` over gloo that keeps the tensors where they are. Two things differ by version
(:mod:`verl_bridge.compat.mcore_versions`):

* ``RESHARD_TASK_ID_KWARG_SINCE`` (0.18): the executor calls ``submit_send(t, rank, task_id=)``
  and ``CopyService.__init__`` takes ``group``; 0.16-0.17 call ``submit_send_with_id(task_id, t,
  rank)``. The service accepts both.
* ``RESHARD_EXECUTOR_CUDA_SYNC_SINCE`` (0.17): ``execute_reshard_plan`` calls
  ``torch.cuda.synchronize()`` after the service ran, whatever the tensors' device. On a machine
  without CUDA there is no device queue to wait for, and :func:`swap_model_weights_cpu` makes
  that one call a no-op for the duration of the swap (``torch.cuda.is_available()`` stays False;
  nothing else about CUDA is changed, and the original function is put back afterwards).

Everything else (planning, slicing, the executor, the write-back) is megatron-core's own code.
"""

from __future__ import annotations

import contextlib
from typing import Any, Optional

import torch
import torch.distributed as dist

from verl_bridge.compat.mcore_versions import copy_service_init_kwargs, reshard_needs_cuda_sync


def _copy_service_base() -> type:
    from megatron.core.resharding.copy_services.base import CopyService

    return CopyService


def make_cpu_copy_service(group: Any = None):
    """A :class:`CpuGlooCopyService` (built lazily: megatron-core < 0.16 has no resharding)."""
    return _cpu_copy_service_class()(group=group)


_CLASS: Optional[type] = None


def _cpu_copy_service_class() -> type:
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    base = _copy_service_base()

    class CpuGlooCopyService(base):  # type: ignore[misc, valid-type]
        """``megatron.core.resharding`` ``CopyService`` over gloo for CPU tensors (0.16-0.19).

        Same-rank transfers are matched by task id and copied; the others go through one
        ``batch_isend_irecv``, each peer's sends and receives ordered by task id on both sides.
        """

        requires_process_group_barrier = True  # 0.19 reads it; the executor then barriers

        def __init__(self, group: Any = None):
            kwargs = copy_service_init_kwargs(group)
            if kwargs:
                super().__init__(**kwargs)
            self.group = group
            self.rank = group.rank() if group is not None else dist.get_rank()
            self.world_size = group.size() if group is not None else dist.get_world_size()
            self._sends: list[tuple[Optional[int], torch.Tensor, int]] = []
            self._recvs: list[tuple[Optional[int], torch.Tensor, int]] = []

        # >= 0.18: task_id as a keyword; 0.16-0.17: the *_with_id variants
        def submit_send(self, src_tensor: torch.Tensor, dest_rank: int, task_id: Optional[int] = None):
            self._sends.append((task_id, src_tensor, dest_rank))

        def submit_recv(self, dest_tensor: torch.Tensor, src_rank: int, task_id: Optional[int] = None):
            self._recvs.append((task_id, dest_tensor, src_rank))

        def submit_send_with_id(self, task_id: int, src_tensor: torch.Tensor, dest_rank: int):
            self.submit_send(src_tensor, dest_rank, task_id=task_id)

        def submit_recv_with_id(self, task_id: int, dest_tensor: torch.Tensor, src_rank: int):
            self.submit_recv(dest_tensor, src_rank, task_id=task_id)

        def close(self) -> None:
            self._sends.clear()
            self._recvs.clear()

        def run(self):
            local_sends = {t: s for t, s, peer in self._sends if peer == self.rank}
            local_recvs = [(t, d) for t, d, peer in self._recvs if peer == self.rank]
            if None in local_sends or any(t is None for t, _ in local_recvs) or len(local_sends) != len(local_recvs):
                raise RuntimeError(f"CpuGlooCopyService rank {self.rank}: same-rank transfers need matching task ids "
                                   f"({len(local_sends)} sends, {len(local_recvs)} receives)")
            with torch.no_grad():
                for task_id, dst in local_recvs:
                    dst.copy_(local_sends[task_id])

            def order(op):  # the same order on the sender and the receiver of every peer pair
                task_id, _, peer = op
                return (peer, -1 if task_id is None else task_id)

            ops, writebacks = [], []
            for _, src, peer in sorted((op for op in self._sends if op[2] != self.rank), key=order):
                ops.append(self._p2p(dist.isend, src.detach().to("cpu").contiguous(), peer))
            for _, dst, peer in sorted((op for op in self._recvs if op[2] != self.rank), key=order):
                buf = dst if dst.is_contiguous() and dst.device.type == "cpu" else torch.empty(
                    dst.shape, dtype=dst.dtype, device="cpu")
                ops.append(self._p2p(dist.irecv, buf, peer))
                if buf is not dst:
                    writebacks.append((buf, dst))
            if ops:
                for req in dist.batch_isend_irecv(ops):
                    req.wait()
            with torch.no_grad():
                for buf, dst in writebacks:
                    dst.copy_(buf)
            self._sends.clear()
            self._recvs.clear()

        def _p2p(self, fn, tensor: torch.Tensor, peer: int):
            if self.group is None:
                return dist.P2POp(fn, tensor, peer)
            return dist.P2POp(fn, tensor, group=self.group, group_peer=peer)

    _CLASS = CpuGlooCopyService
    return _CLASS


@contextlib.contextmanager
def _no_cuda_sync_without_cuda():
    """``torch.cuda.synchronize`` as a no-op while there is no CUDA (see the module docstring)."""
    if torch.cuda.is_available() or not reshard_needs_cuda_sync():
        yield
        return
    original = torch.cuda.synchronize
    torch.cuda.synchronize = lambda device=None: None
    try:
        yield
    finally:
        torch.cuda.synchronize = original


def swap_model_weights_cpu(src_model, target_model, group: Any = None) -> None:
    """``megatron.core.resharding.swap_model_weights(src_model, target_model, service)`` with a
    :class:`CpuGlooCopyService` (CUDA machines: pass ``"nccl"`` or ``"gloo"`` to megatron directly)."""
    from megatron.core.resharding import swap_model_weights

    service = make_cpu_copy_service(group)
    kwargs = {"group": group} if group is not None else {}
    with _no_cuda_sync_without_cuda():
        swap_model_weights(src_model, target_model, service, **kwargs)
