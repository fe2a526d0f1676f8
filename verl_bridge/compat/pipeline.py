"""megatron-core's pipeline schedules (1F1B, interleaved) on the CPU over gloo.

megatron-core's ``get_forward_backward_func()`` returns ``forward_backward_pipelining_without_interleaving``
(PP > 1) or ``forward_backward_pipelining_with_interleaving`` (PP > 1 with a virtual pipeline). Both
run on any device except for three CUDA assumptions, each shimmed here for the CPU only (on CUDA
:func:`cpu_pipeline_schedule` is never used; the schedules run exactly as megatron ships them):

===============================  ================================================================
shim                             what it replaces, and why
===============================  ================================================================
:class:`CpuP2PCommunicator`      ``P2PCommunicator._communicate`` / ``_communicate_shapes``
(megatron-core >= 0.15:          allocate the receive buffers (activations, their gradients and the
``P2P_COMMUNICATOR_SINCE``)      shape tensors) with ``device=torch.cuda.current_device()`` and call
                                 ``torch.cuda.synchronize()`` after batched P2P. The subclass
                                 allocates them on the CPU and waits on the requests instead; the
                                 sends and receives themselves are megatron's own
                                 ``_p2p_ops`` / ``_batched_p2p_ops``. The schedules take it through
                                 their public ``p2p_communicator=`` argument. It also always
                                 exchanges the shapes first (megatron's ``variable_seq_lengths``
                                 path), so a short last micro-batch of a mini-batch is received
                                 with its own shape. It always sends through ``_p2p_ops``, never
                                 ``_batched_p2p_ops`` (``batch_p2p_comm``, the interleaved
                                 schedule's default): gloo matches a receive to a send by peer and
                                 tag in posting order, and the batched order (send_prev, recv_prev,
                                 send_next, recv_next on every rank) pairs, at PP=2 where prev and
                                 next are the same rank, one stage's activation send with the other
                                 stage's gradient receive; the two same-shaped tensors arrive
                                 swapped, silently. ``_p2p_ops`` orders even and odd ranks so that
                                 every send meets its receive (and at PP=2 puts the two directions
                                 on two communicators).
:func:`~verl_bridge.compat.     the schedules' ``total_num_tokens = torch.zeros([], ...,
cpu_device.cpu_device_shims`     device="cuda")``, and what the model calls inside them (SP
(0.12-0.19)                      scatter/gather buffers): active only during the schedule call.
``pipeline_dtype``               the receive buffers need ``config.pipeline_dtype``; a model whose
(every version)                  provider left it unset gets its ``params_dtype`` (what Megatron-LM's
                                 argument parser sets), on this model's config only.
===============================  ================================================================

Before 0.15 megatron-core's P2P layer is a set of module functions that the schedules call
directly (no ``p2p_communicator=`` argument); shimming it would mean patching the library module,
which verl-bridge does not do: :func:`cpu_pipeline_schedule` refuses there with that reason.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from verl_bridge.compat.cpu_device import cpu_device_shims
from verl_bridge.compat.mcore_versions import mcore_version

P2P_COMMUNICATOR_SINCE = (0, 15)


def _cpu_p2p_communicator_class():
    from megatron.core.pipeline_parallel import p2p_communication as p2p

    class CpuP2PCommunicator(p2p.P2PCommunicator):
        """megatron's P2PCommunicator with its receive buffers on the CPU (see the module docstring)."""

        def _exchange_shapes(self, tensor_send_next, tensor_send_prev, recv_prev, recv_next):
            recv_prev_shape = torch.empty(3, dtype=torch.int64) if recv_prev else None
            recv_next_shape = torch.empty(3, dtype=torch.int64) if recv_next else None
            send_prev_shape = (torch.tensor(tensor_send_prev.size(), dtype=torch.int64)
                               if tensor_send_prev is not None else None)
            send_next_shape = (torch.tensor(tensor_send_next.size(), dtype=torch.int64)
                               if tensor_send_next is not None else None)
            reqs = p2p._p2p_ops(tensor_send_prev=send_prev_shape, tensor_recv_prev=recv_prev_shape,
                                tensor_send_next=send_next_shape, tensor_recv_next=recv_next_shape,
                                group=self.pp_group, prev_pipeline_rank=self.prev_rank,
                                next_pipeline_rank=self.next_rank)
            for req in reqs.values():
                req.wait()
            return (recv_prev_shape.tolist() if recv_prev_shape is not None else [0, 0, 0],
                    recv_next_shape.tolist() if recv_next_shape is not None else [0, 0, 0])

        def _communicate_shapes(self, tensor_send_next, tensor_send_prev, recv_prev, recv_next):
            return self._exchange_shapes(tensor_send_next, tensor_send_prev, recv_prev, recv_next)

        def _communicate(self, *, tensor_send_next, tensor_send_prev, recv_prev: bool, recv_next: bool,
                         tensor_shape, wait_on_reqs: bool = True):
            config = self.config
            if (recv_prev or recv_next) and config.pipeline_dtype is None:
                raise RuntimeError("pipeline_dtype must be provided to receive pipeline tensors")
            recv_prev_shape, recv_next_shape = self._exchange_shapes(tensor_send_next, tensor_send_prev,
                                                                     recv_prev, recv_next)
            recv_prev_t = (torch.empty(recv_prev_shape, requires_grad=True, dtype=config.pipeline_dtype)
                           if recv_prev else None)
            recv_next_t = (torch.empty(recv_next_shape, requires_grad=True, dtype=config.pipeline_dtype)
                           if recv_next else None)
            # megatron's own paired isend/irecv, never its batched variant (see the module docstring)
            reqs = p2p._p2p_ops(tensor_send_prev=tensor_send_prev, tensor_recv_prev=recv_prev_t,
                            tensor_send_next=tensor_send_next, tensor_recv_next=recv_next_t,
                            group=self.pp_group, prev_pipeline_rank=self.prev_rank,
                            next_pipeline_rank=self.next_rank)
            if (wait_on_reqs or config.batch_p2p_comm) and len(reqs) > 0:
                for req in reqs.values():
                    req.wait()
                reqs = None
            return recv_prev_t, recv_next_t, reqs

    return CpuP2PCommunicator


def _pg_collection():
    """The process groups megatron's schedules build for themselves when given none."""
    from megatron.core import parallel_state as mpu
    from megatron.core.process_groups_config import ProcessGroupCollection

    pgs = ProcessGroupCollection()
    pgs.tp = mpu.get_tensor_model_parallel_group()
    pgs.cp = mpu.get_context_parallel_group()
    pgs.embd = mpu.get_embedding_group(check_initialized=False)
    pgs.pos_embd = mpu.get_position_embedding_group(check_initialized=False)
    pgs.pp = mpu.get_pipeline_model_parallel_group()
    pgs.dp_cp = mpu.get_data_parallel_group(with_context_parallel=True, partial_data_parallel=False)
    return pgs


def ensure_pipeline_dtype(model_chunks) -> None:
    """``config.pipeline_dtype`` = ``params_dtype`` where the provider left it unset (this model only)."""
    from verl_bridge.compat import unwrap_model

    for chunk in model_chunks:
        config = getattr(unwrap_model(chunk), "config", None)
        if config is not None and getattr(config, "pipeline_dtype", None) is None:
            config.pipeline_dtype = config.params_dtype


def pipeline_unsupported_reason() -> Optional[str]:
    """Why megatron's pipeline schedules cannot run on this CPU install, or None when they can."""
    v = mcore_version()
    if v < P2P_COMMUNICATOR_SINCE:
        return (f"megatron-core {v[0]}.{v[1]} has no P2PCommunicator (added in "
                f"{P2P_COMMUNICATOR_SINCE[0]}.{P2P_COMMUNICATOR_SINCE[1]}): its pipeline schedules allocate "
                "their receive buffers on CUDA inside module functions that verl-bridge would have to patch; "
                f"upgrade megatron-core to >= {P2P_COMMUNICATOR_SINCE[0]}.{P2P_COMMUNICATOR_SINCE[1]} or use "
                "pp_size=1 on CPU")
    return None


def cpu_pipeline_schedule(pp_size: int, vp_size: Optional[int] = None) -> Callable:
    """megatron-core's pipelined schedule for (``pp_size``, ``vp_size``), run on the CPU over gloo.

    The function megatron's ``get_forward_backward_func`` picks, called with a
    :class:`CpuP2PCommunicator` and the usual process groups, inside ``cpu_device_shims()``.
    """
    reason = pipeline_unsupported_reason()
    if reason is not None:
        raise RuntimeError(f"pipeline parallelism on CPU (pp_size={pp_size}): {reason}")
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.utils import get_model_config

    mcore_fb = get_forward_backward_func(pp_size=pp_size, vp_size=vp_size)
    communicator = _cpu_p2p_communicator_class()

    def forward_backward(*, model, **kwargs):
        from megatron.core import parallel_state as mpu

        chunks = model if isinstance(model, (list, tuple)) else [model]
        ensure_pipeline_dtype(chunks)
        config = get_model_config(chunks[0])
        p2p = communicator(pp_group=mpu.get_pipeline_model_parallel_group(), config=config)
        with cpu_device_shims():
            return mcore_fb(model=model, p2p_communicator=p2p, pg_collection=_pg_collection(), **kwargs)

    forward_backward.mcore_schedule = mcore_fb  # which of megatron's schedules runs (tests read it)
    return forward_backward
