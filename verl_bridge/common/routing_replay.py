"""Routing replay (R3) for MoE actors: ``algorithm.moe_routing_replay: true``.

The rollout's expert choices are reused in the training forwards, so the policy that is optimised
routes each token as the policy that sampled it did (verl, slime and NeMo-RL offer the same). It
runs on megatron-core's own ``RouterReplay`` (``megatron.core.transformer.moe.router_replay``,
present in 0.16.1 and 0.19.2; a model built with ``moe_enable_routing_replay=True`` gives each
``TopKRouter`` one): ``RECORD`` stores a forward's top-k indices, ``REPLAY_FORWARD`` routes with
given indices (gating scores gathered at them, so the router still gets its gradient).

* Rollout (native engine, :class:`RoutingRecorder`): every forward of the generation (prefill, then
  one per decode step) records each MoE layer's top-k indices, ``[tokens, k]`` in megatron's
  ``(sequence, batch)`` order; one extra forward routes the last sampled token. They are assembled
  into ``routed_experts`` ``[B, P + R, layers, k]`` (int64) aligned with the experience's
  ``input_ids``; positions the engine never fed (padding after every sequence ended) get experts
  ``0..k-1``, and their outputs are masked out of every loss.
* Training (:func:`replaying`): each forward over experience rows (old log-probs, reference
  log-probs, the update's micro-batches) sets each router's target to those rows' choices. The
  experience tensors travel with the rows through shuffling and micro-batching.

Layers are matched by order (``model.modules()``); the per-instance ``RouterReplay`` API is used,
never megatron's global instance list, so actor and reference (each with its own routers) do not mix.
Limits (refused by the config validator): TP = 1, PP = 1, the native rollout engine.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch

ROUTED_KEY = "routed_experts"


def available() -> Optional[str]:
    """None when the installed megatron-core exposes routing replay, else what is missing."""
    try:
        from megatron.core.transformer.moe.router_replay import RouterReplayAction  # noqa: F401
        from megatron.core.transformer.transformer_config import TransformerConfig
    except ImportError:
        from verl_bridge.compat.mcore_versions import mcore_version

        v = mcore_version()
        return (f"megatron-core {v[0]}.{v[1]} has no megatron.core.transformer.moe.router_replay (RouterReplay), "
                f"which routing replay needs (0.16.1 and 0.19.2 have it)")
    if "moe_enable_routing_replay" not in getattr(TransformerConfig, "__dataclass_fields__", {}):
        return "this megatron-core's TransformerConfig has no moe_enable_routing_replay"
    return None


def replay_objects(model: torch.nn.Module) -> list:
    """The ``RouterReplay`` of each MoE layer of ``model``, in layer order (empty: none enabled)."""
    from megatron.core.transformer.moe.router import TopKRouter

    return [m.router_replay for m in model.modules()
            if isinstance(m, TopKRouter) and getattr(m, "router_replay", None) is not None]


def check_model(model: torch.nn.Module) -> None:
    from verl_bridge.compat.moe import is_moe_model

    if not is_moe_model(model):
        raise RuntimeError("algorithm.moe_routing_replay=true needs a Mixture-of-Experts actor "
                           "(TransformerConfig.num_moe_experts); this actor is dense")
    if not replay_objects(model):
        raise RuntimeError("algorithm.moe_routing_replay=true: the actor's routers have no RouterReplay; build "
                           "the model with TransformerConfig(moe_enable_routing_replay=True) (the tiny-moe "
                           "preset does so when the option is on)")


class RoutingRecorder:
    """Records the routing of one generation; :meth:`step` after each forward, :meth:`result` at the end."""

    def __init__(self, model: torch.nn.Module):
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        self.replays = replay_objects(model)
        self.chunks: list[list[torch.Tensor]] = [[] for _ in self.replays]  # per layer: [s, b, k] pieces
        for r in self.replays:
            r.clear_indices()
            r.set_router_replay_action(RouterReplayAction.RECORD)

    def step(self, bsz: int) -> None:
        for i, r in enumerate(self.replays):
            idx = r.get_recorded_indices()
            self.chunks[i].append(idx.detach().reshape(-1, bsz, idx.shape[-1]).to(torch.long))
            r.record_indices(None)

    def close(self) -> None:
        for r in self.replays:
            r.clear_router_replay_action()
            r.clear_indices()

    def result(self, bsz: int, total: int, device) -> torch.Tensor:
        """``[B, total, layers, k]``; positions not fed get experts ``0..k-1``."""
        per_layer = [torch.cat(c, dim=0) for c in self.chunks]  # [s, b, k] each
        k = per_layer[0].shape[-1]
        out = torch.arange(k, device=device).expand(bsz, total, len(per_layer), k).clone()
        for i, t in enumerate(per_layer):
            s = min(t.shape[0], total)
            out[:, :s, i, :] = t[:s].permute(1, 0, 2).to(device)
        return out


@contextlib.contextmanager
def replaying(model: torch.nn.Module, routed: Optional[torch.Tensor]):
    """Within the block, ``model``'s routers route with ``routed`` (``[B, S, layers, k]``, the rows of
    the forward's batch); a no-op when ``routed`` is None or the model has no RouterReplay."""
    replays = replay_objects(model) if routed is not None else []
    if not replays:
        yield
        return
    from megatron.core.transformer.moe.router_replay import RouterReplayAction

    if routed.shape[2] != len(replays):
        raise RuntimeError(f"routing replay: the experience holds {routed.shape[2]} MoE layers' choices, "
                           f"the model has {len(replays)} MoE layers")
    try:
        for i, r in enumerate(replays):
            r.clear_indices()
            r.set_target_indices(routed[:, :, i, :].permute(1, 0, 2).reshape(-1, routed.shape[-1]))
            r.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
        yield
    finally:
        for r in replays:
            r.clear_router_replay_action()
            r.clear_indices()
