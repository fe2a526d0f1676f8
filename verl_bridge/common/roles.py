"""Actor, reference and critic models built from one provider.

* actor: the provider's model, trainable, with its optimizer;
* reference: the same provider, frozen, with the actor's *initial* weights (copied, so the user's
  loader runs once), optionally offloaded to CPU between uses;
* critic (``type: megatron``): the provider's model with ``output_layer`` replaced by a scalar
  :class:`ValueHead`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch


@dataclass
class Roles:
    """The models of one run on this rank (what :meth:`verl_bridge.MegatronBridge.build_roles` returns)."""

    actor: torch.nn.Module
    actor_optimizer: Any
    reference: Optional[torch.nn.Module]
    critic: Optional[torch.nn.Module]
    critic_optimizer: Any


class ValueHead(torch.nn.Module):
    """Scalar head with the call contract of megatron's output layer: returns ``(values, None)``."""

    def __init__(self, hidden_size: int, dtype: torch.dtype = torch.float32, sequence_parallel: bool = False):
        super().__init__()
        # sequence parallel: the hidden states arrive split over TP along the sequence; the head is
        # replicated, so it gathers them (megatron's gather; its backward splits, no reduction)
        self.sequence_parallel = sequence_parallel
        # named weight/bias directly so the checkpoint key is ``output_layer.weight``, as megatron's
        # LanguageModule.sharded_state_dict expects
        self.weight = torch.nn.Parameter(torch.zeros(1, hidden_size, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.zeros(1, dtype=dtype))

    def forward(self, hidden_states, weight=None, runtime_gather_output=None, **_):
        if self.sequence_parallel:
            from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

            hidden_states = gather_from_sequence_parallel_region(hidden_states, tensor_parallel_output_grad=False)
        return torch.nn.functional.linear(hidden_states, self.weight, self.bias), None


def to_critic(model: torch.nn.Module) -> torch.nn.Module:
    """Turn a post-processing GPTModel into a critic: output layer -> scalar value head."""
    if not getattr(model, "post_process", True):
        # a pipeline stage before the last (the last holds the value head): its word embedding is
        # no longer tied to an output layer, so no tied-embedding reduction waits for the last stage
        model.share_embeddings_and_output_weights = False
        return model
    if not hasattr(model, "output_layer"):
        raise ValueError("a megatron critic needs a GPTModel built with post_process=True (it has no output_layer)")
    hidden = model.config.hidden_size
    device = next(model.parameters()).device  # the head lives where the model does (CUDA too)
    sp = bool(getattr(model.config, "sequence_parallel", False)) and model.config.tensor_model_parallel_size > 1
    model.output_layer = ValueHead(hidden, dtype=model.config.params_dtype, sequence_parallel=sp).to(device)
    model.share_embeddings_and_output_weights = False
    return model


def frozen_copy(build, source: torch.nn.Module, offload: bool = False) -> torch.nn.Module:
    """A frozen twin of ``source``: built by ``build()`` (the same provider) and loaded with its weights.

    Rebuilding instead of ``deepcopy`` keeps megatron's process-group handles valid.
    """
    ref = build()
    ref.load_state_dict(source.state_dict(), strict=True)
    for p in ref.parameters():
        p.requires_grad_(False)
    ref.eval()
    if offload:
        ref.to("cpu")
    return ref
