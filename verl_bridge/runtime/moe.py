"""MoE metrics of an actor update: ``moe/aux_loss`` and ``moe/tokens_per_expert_cv``.

* ``moe/aux_loss``: megatron's load-balancing loss (``moe_router_load_balancing_type: aux_loss``)
  as megatron logs it (``load_balancing_loss``: the loss before its coefficient), averaged over
  the MoE layers and the update's micro-batches. megatron's router records it in its metrics
  tracker during every training forward (``MoEAuxLossAutoScaler`` adds ``coeff * loss`` to the
  gradients); the tracker's API moved in 0.19 (``get_moe_metrics_tracker()``; before,
  ``get_moe_layer_wise_logging_tracker()``), both read here (:func:`_aux_values`).
* ``moe/tokens_per_expert_cv``: coefficient of variation (std / mean) of the number of token
  assignments each expert received over the update, summed over the data-parallel ranks, averaged
  over the MoE layers; 0 is a perfectly balanced router. With sequence parallelism both are summed
  over the TP ranks first (each routes its slice of the sequence). Counted from each ``TopKRouter``'s
  routing map (a forward hook on megatron's router).

:func:`moe_metrics_for` returns None for a dense model.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

AUX_LOSS_NAME = "load_balancing_loss"  # megatron's tracker key for the aux_loss load balancing


def _tracker_entries() -> dict:
    """``{name: values tensor [num_layers]}`` of megatron's MoE metrics tracker (0.19 API or the older one)."""
    try:
        from megatron.core.transformer.moe import moe_logging  # 0.19

        return {k: e.values for k, e in moe_logging.get_moe_metrics_tracker().metrics.items()}
    except ImportError:
        from megatron.core.transformer.moe import moe_utils

        return {k: e["values"] for k, e in moe_utils.get_moe_layer_wise_logging_tracker().items()}


def _aux_values() -> Optional[torch.Tensor]:
    return _tracker_entries().get(AUX_LOSS_NAME)


def _clear_tracker() -> None:
    for v in _tracker_entries().values():
        v.zero_()


class MoEMetrics:
    def __init__(self, model: torch.nn.Module):
        from megatron.core.transformer.moe.router import TopKRouter

        self.routers = [m for m in model.modules() if isinstance(m, TopKRouter)]
        self.counts = [None] * len(self.routers)
        self.train_calls = [0] * len(self.routers)
        for i, r in enumerate(self.routers):
            r.register_forward_hook(self._hook(i))

    def _hook(self, i: int):
        def hook(module, _inputs, output):
            if not self.active:
                return
            routing_map = output[1]  # [tokens, num_experts], bool (or the indices map)
            c = routing_map.detach().to(torch.float64).sum(dim=0)
            self.counts[i] = c if self.counts[i] is None else self.counts[i] + c
            if module.training and torch.is_grad_enabled():
                self.train_calls[i] += 1
        return hook

    active = False

    def start(self) -> None:
        self.counts = [None] * len(self.routers)
        self.train_calls = [0] * len(self.routers)
        _clear_tracker()
        self.active = True

    def finish(self, dp_group=None, dp_size: int = 1) -> dict[str, float]:
        """The metrics of the forwards since :meth:`start`; every DP rank must call it (one all-reduce)."""
        self.active = False
        n = len(self.routers)
        num_experts = self.routers[0].config.num_moe_experts if n else 0
        counts = torch.stack([c if c is not None else torch.zeros(num_experts, dtype=torch.float64)
                              for c in self.counts]) if n else torch.zeros(0, 0, dtype=torch.float64)
        values = _aux_values()
        aux = torch.tensor([float(values.detach().double().sum()) if values is not None else 0.0],
                           dtype=torch.float64)
        cfg = self.routers[0].config if n else None
        if n and getattr(cfg, "sequence_parallel", False) and getattr(cfg, "tensor_model_parallel_size", 1) > 1:
            # sequence parallel: each TP rank routes its slice of the tokens, and megatron's loss on a
            # slice is that slice's share of the whole (its tracker sums it over TP): sum both over TP
            from megatron.core import parallel_state as mpu

            tp_group = mpu.get_tensor_model_parallel_group()
            dist.all_reduce(counts, group=tp_group)
            dist.all_reduce(aux, group=tp_group)
        if dp_size > 1 and n:
            if dp_group is None:
                from verl_bridge.distributed import data_parallel_group

                dp_group = data_parallel_group()
            dist.all_reduce(counts, group=dp_group)
        out = {}
        if n:
            mean = counts.mean(dim=1).clamp_min(1e-12)
            out["moe/tokens_per_expert_cv"] = float((counts.std(dim=1, unbiased=False) / mean).mean())
        calls = sum(self.train_calls)
        if values is not None and calls:
            out["moe/aux_loss"] = float(aux.item()) / calls
        elif n:
            out["moe/aux_loss"] = 0.0
        return out


def moe_metrics_for(model: torch.nn.Module) -> Optional[MoEMetrics]:
    """The (cached) :class:`MoEMetrics` of an MoE model, None for a dense one."""
    from verl_bridge.compat import unwrap_model
    from verl_bridge.compat.moe import is_moe_model

    if not is_moe_model(model):
        return None
    m = unwrap_model(model)
    cached = getattr(m, "_verl_bridge_moe_metrics", None)
    if cached is None:
        cached = MoEMetrics(m)
        m._verl_bridge_moe_metrics = cached
    return cached
