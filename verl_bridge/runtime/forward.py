"""Run a role's model over micro-batches with megatron's schedule, and slice its response logits.

Megatron models run under ``forward_backward_func`` (pipeline schedules included; a list of model
chunks is a virtual pipeline); a replicated non-megatron module (the Hugging Face critic,
``runs_outside_megatron_schedule``) runs the plain loop of :mod:`verl_bridge.runtime.schedule` on any
device and PP size.

With PP > 1 only the last stage computes the loss function, so only it gets the per-micro-batch
results; they are broadcast over the pipeline group from there, so every stage returns the same
list (log-probs, values and update statistics are needed on every rank).
"""

from __future__ import annotations

from functools import partial

import torch

from verl_bridge.common.batch import Experience, model_inputs, response_outputs
from verl_bridge.runtime.logprobs import mask_padded_vocab
from verl_bridge.common.routing_replay import ROUTED_KEY, replaying
from verl_bridge.runtime.schedule import cpu_forward_backward_no_pipelining, get_forward_backward_func


def forward_micro_batches(model, batches: list[Experience], loss_fn, *, pp_size: int, forward_only: bool) -> list[dict]:
    """``loss_fn(mb, output) -> (loss, stats)`` on each micro-batch; returns the stats of each."""
    chunks = list(model) if isinstance(model, (list, tuple)) else [model]
    outside = getattr(chunks[0], "runs_outside_megatron_schedule", False)
    vp = len(chunks) if len(chunks) > 1 else None
    fb = cpu_forward_backward_no_pipelining if outside else get_forward_backward_func(pp_size, vp)

    packed = batches[0].packed is not None
    if packed:  # a pipeline passes activations of one shape between stages: pad every micro-batch to it
        same = pp_size > 1 or len(chunks) > 1
        longest = max(b.packed.length for b in batches)
        most_rows = max(b.packed.rows for b in batches)
    pad = 0 if outside else _sequence_parallel_padding(chunks[0], batches[0].input_ids.shape[1])

    def forward_step(data_iterator, module):
        mb = next(data_iterator)
        if mb.packed is not None:
            n = longest if same else mb.packed.length
            ids, pos, mask = mb.packed.inputs(n + (0 if outside else _sequence_parallel_padding(chunks[0], n)),
                                              most_rows if same else None)
            return module(ids, pos, mask), partial(loss_fn, mb)
        ids, am = mb.input_ids, mb.attention_mask
        if pad:  # masked positions after the sequence: outputs never read, earlier positions unchanged
            ids = torch.nn.functional.pad(ids, (0, pad), value=0)
            am = torch.nn.functional.pad(am, (0, pad), value=0)
        ids, pos, mask = model_inputs(ids, am)
        with replaying(module, mb.tensors.get(ROUTED_KEY) if hasattr(mb, "tensors") else None):
            out = module(ids, pos, mask)  # routing replay: the rollout's expert choices (MoE)
        return out, partial(loss_fn, mb)

    seq = batches[0].input_ids.shape[1] + pad
    if packed:
        seq = longest + (0 if outside else _sequence_parallel_padding(chunks[0], longest))
    # a virtual pipeline: every chunk reads the micro-batches through its own iterator
    data = [iter(batches) for _ in chunks] if len(chunks) > 1 else iter(batches)
    res = fb(forward_step_func=forward_step, data_iterator=data, model=chunks,
             num_microbatches=len(batches), seq_length=seq,
             micro_batch_size=most_rows if packed else batches[0].size,
             forward_only=forward_only)
    if pp_size > 1 and not outside:
        res = broadcast_from_last_stage(res)
    return res


def _sequence_parallel_padding(model, seq: int) -> int:
    """Positions to append so that ``seq`` splits over TP (sequence parallelism needs it), else 0."""
    from verl_bridge.compat import unwrap_model

    config = getattr(unwrap_model(model), "config", None)
    tp = getattr(config, "tensor_model_parallel_size", 1) or 1
    if not getattr(config, "sequence_parallel", False) or tp <= 1:
        return 0
    return (-seq) % tp


def broadcast_from_last_stage(obj):
    """``obj`` as the last pipeline stage holds it, on every stage of this rank's pipeline group."""
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu

    group = mpu.get_pipeline_model_parallel_group()
    if group is None or dist.get_world_size(group) <= 1:
        return obj
    src = dist.get_process_group_ranks(group)[-1]
    box = [obj if dist.get_rank() == src else None]
    dist.broadcast_object_list(box, src=src, group=group)
    return box[0]


def response_logits(output: torch.Tensor, mb: Experience, temperature: float, vocab_size=None) -> torch.Tensor:
    """fp32 logits over ``mb``'s response tokens, divided by the sampling temperature (when not 0 or 1),
    megatron's vocabulary padding (ids >= ``vocab_size``) masked out as the samplers do."""
    logits = response_outputs(output, mb)
    t = temperature
    logits = logits.float() / t if t and t != 1.0 else logits.float()
    return mask_padded_vocab(logits, vocab_size)


def response_token_log_probs(output: torch.Tensor, mb: Experience, temperature: float, vocab_size=None) -> torch.Tensor:
    """log p of ``mb``'s response tokens ``[B, R]`` (fp32): what :func:`response_logits` then
    ``token_log_probs`` give, at TP=1 without materialising fp32 logits
    (:func:`~verl_bridge.runtime.logprobs.fused_token_log_probs`); TP>1 goes through megatron's
    vocab-parallel cross-entropy on the sharded logits."""
    from verl_bridge.runtime.logprobs import fused_token_log_probs, tensor_parallel_size, token_log_probs

    if tensor_parallel_size() > 1:
        return token_log_probs(response_logits(output, mb, temperature, vocab_size), mb.response_ids)
    return fused_token_log_probs(response_outputs(output, mb), mb.response_ids, temperature, vocab_size)


def response_log_probs_and_entropy(output: torch.Tensor, mb: Experience, temperature: float,
                                   vocab_size=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Without gradient: log p of ``mb``'s response tokens and the entropy at each, ``[B, R]`` fp32;
    at TP=1 in row chunks of the model's logits, at TP>1 on the vocab-parallel fp32 logits."""
    from verl_bridge.runtime.logprobs import (fused_log_probs_and_entropy, tensor_parallel_size, token_entropy,
                                              token_log_probs)

    if tensor_parallel_size() > 1:
        logits = response_logits(output, mb, temperature, vocab_size)
        return token_log_probs(logits, mb.response_ids), token_entropy(logits)
    return fused_log_probs_and_entropy(response_outputs(output, mb), mb.response_ids, temperature, vocab_size)


class eval_mode:
    """``model.eval()`` inside the block (dropout off), the caller's mode restored after it."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def __enter__(self):
        self.was_training = self.model.training
        self.model.eval()
        return self.model

    def __exit__(self, *exc):
        self.model.train(self.was_training)


def response_values(output: torch.Tensor, mb: Experience) -> torch.Tensor:
    """A value model's fp32 outputs over ``mb``'s response tokens, ``[B, R]``."""
    return response_outputs(output, mb).squeeze(-1).float()
