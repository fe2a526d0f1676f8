"""A Hugging Face critic (``model.critic.type: huggingface``) next to a Megatron actor.

The seed article's layout: the actor is a megatron-core model, the critic a plain ``transformers``
backbone (``AutoModel.from_pretrained(model.critic.args.model_name_or_path)``) with a scalar
value head. :class:`HFCritic` gives it the actor's call contract so the trainer's forward/backward
code does not care which kind it runs::

    module(input_ids [B,S], position_ids [B,S], attention_mask [B,1,S,S] bool, True = masked) -> [B,S,1]

The megatron mask (causal + key padding, see :func:`verl_bridge.common.batch.model_inputs`) is
handed to HF as a 4-D additive float mask (0 = attend, dtype min = masked), which transformers
passes through unchanged to eager and SDPA attention; ``position_ids`` go through as they are
(left-padded prompts keep their positions). ``None`` as mask means plain causal attention.
Token ids beyond the HF vocabulary (megatron pads the actor's vocabulary to a multiple of 128 x TP,
and the actor can sample those rows) are read as token 0.

Parallelism: the critic is replicated. Every TP and PP rank holds the whole model and (since
the ranks of one DP replica see the same samples) computes the same gradients; DP ranks average
gradients as for the actor. The trainer runs it outside megatron's schedules (plain
forward/backward on every rank, ``runs_outside_megatron_schedule``), and
:class:`ReplicatedOptimizer` takes the local gradient norm as the global one (no sum over
model-parallel ranks, which would count each replica again). Dropout stays off (``train()``
keeps the backbone in eval mode) so replicas never diverge.

Checkpoints: ``state_dict()`` (legacy layout) and ``sharded_state_dict()`` (torch_dist, every
tensor replicated across TP/DP) make it a drop-in for the trainer's Megatron checkpoint code;
keys are ``backbone.<HF name>`` and ``value_head.weight`` / ``value_head.bias``.
"""

from __future__ import annotations

from typing import Optional

import torch

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _output_dim(hf_config) -> int:
    # OPT projects the last hidden state to word_embed_proj_dim when it differs from hidden_size
    proj = getattr(hf_config, "word_embed_proj_dim", None)
    return int(proj or hf_config.hidden_size)


def additive_mask(mask: Optional[torch.Tensor], dtype: torch.dtype) -> Optional[torch.Tensor]:
    """megatron bool mask (True = masked) -> HF 4-D additive mask (0 = attend, dtype min = masked)."""
    if mask is None:
        return None
    if mask.dim() != 4:
        raise ValueError(f"HFCritic expects megatron's [B,1,S,S] attention mask, got shape {tuple(mask.shape)}")
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return out.masked_fill(mask.bool(), torch.finfo(dtype).min)


class HFCritic(torch.nn.Module):
    """``transformers`` backbone + scalar value head with megatron's ``(ids, positions, mask)`` contract."""

    # the trainer runs it with the plain forward/backward loop, never megatron's (pipeline) schedules
    runs_outside_megatron_schedule = True

    def __init__(self, backbone: torch.nn.Module):
        super().__init__()
        self.backbone = backbone
        dtype = next(backbone.parameters()).dtype
        # zero init: the first values are 0 everywhere, as for the megatron critic's ValueHead
        self.value_head = torch.nn.Linear(_output_dim(backbone.config), 1, dtype=dtype)
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)
        self.backbone.eval()
        self.vocab_size = backbone.get_input_embeddings().num_embeddings

    def train(self, mode: bool = True) -> "HFCritic":
        super().train(mode)
        self.backbone.eval()  # no dropout: replicas on TP/PP ranks must stay identical
        return self

    def set_input_tensor(self, input_tensor) -> None:
        """megatron's schedules call this on every model; a replicated HF critic is never pipelined."""

    def forward(self, input_ids, position_ids=None, attention_mask=None, **_):
        dtype = self.value_head.weight.dtype
        # the actor may sample from megatron's padded vocabulary rows (ids >= the HF vocabulary):
        # such tokens have no embedding here and are read as token 0 (no host sync, no error mid-run)
        input_ids = torch.where(input_ids < self.vocab_size, input_ids, torch.zeros_like(input_ids))
        out = self.backbone(input_ids=input_ids, position_ids=position_ids,
                            attention_mask=additive_mask(attention_mask, dtype), use_cache=False)
        return self.value_head(out.last_hidden_state)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets=(), metadata=None) -> dict:
        """torch_dist: every tensor a ShardedTensor replicated over PP, TP and DP; the copy of
        (PP, TP, DP) rank (0, 0, 0) is the primary one that gets written."""
        from megatron.core import parallel_state as mpu
        from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

        out = make_sharded_tensors_for_checkpoint(self.state_dict(keep_vars=True), prefix)
        pp_rank = mpu.get_pipeline_model_parallel_rank() if mpu.model_parallel_is_initialized() else 0
        for sh in out.values():  # megatron's replica_id is (0, tp_rank, dp_rank): add the PP replica
            rid = tuple(sh.replica_id) if isinstance(sh.replica_id, tuple) else (0, sh.replica_id, 0)
            sh.replica_id = (pp_rank,) + rid[1:]
        return out


def build_hf_critic(model_name_or_path: str, precision: str = "fp32", device=None) -> HFCritic:
    """``AutoModel.from_pretrained`` (local files only) wrapped as an :class:`HFCritic`."""
    from transformers import AutoModel

    dtype = _DTYPES.get(precision, torch.float32)
    if precision != "fp32" and (device is None or torch.device(device).type == "cpu"):
        dtype = torch.float32  # half precision on CPU is slow and lossy; the actor's CPU runs use fp32 too
    from transformers.utils import logging as hf_logging

    # the load report lists the causal-LM head (``lm_head.weight``) as unexpected: expected for a
    # critic, so transformers' report is silenced and only missing backbone weights are an error
    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        backbone, info = AutoModel.from_pretrained(model_name_or_path, dtype=dtype, local_files_only=True,
                                                   output_loading_info=True)
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        raise ValueError(f"{model_name_or_path} lacks backbone weights {', '.join(missing[:5])}"
                         + (f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""))
    critic = HFCritic(backbone)
    if device is not None:
        critic.to(device)
    return critic


def _replicated_optimizer_class():
    from verl_bridge.runtime.optimizer import TorchOptimizer

    class ReplicatedOptimizer(TorchOptimizer):
        """TorchOptimizer for a module replicated on every model-parallel rank: its local
        gradient norm (after the DP average) is the global one."""

        def grad_norm(self) -> float:
            sq = torch.zeros(1, dtype=torch.float64, device=self.params[0].device if self.params else "cpu")
            for p in self.params:
                if p.grad is not None:
                    sq += p.grad.detach().double().pow(2).sum()
            return float(sq.sqrt().item())

    return ReplicatedOptimizer


def build_replicated_optimizer(model: torch.nn.Module, optim_cfg, layout=None):
    """The critic's optimizer: :func:`verl_bridge.runtime.optimizer.build_optimizer`'s, replica-aware norm."""
    return _replicated_optimizer_class()(
        model, lr=optim_cfg.lr, weight_decay=optim_cfg.weight_decay, betas=optim_cfg.betas,
        eps=optim_cfg.eps, clip_grad=optim_cfg.clip_grad, warmup_steps=optim_cfg.warmup_steps, layout=layout,
    )
