"""Run a role's model over micro-batches with megatron's schedule, and slice its response logits.

Megatron models run under ``forward_backward_func`` (pipeline schedules included); a replicated
non-megatron module (the Hugging Face critic, ``runs_outside_megatron_schedule``) runs the plain
loop of :mod:`verl_bridge.runtime.schedule` on any device and PP size.
"""

from __future__ import annotations

from functools import partial

import torch

from verl_bridge.runtime.batch import Experience, model_inputs, response_slice
from verl_bridge.runtime.logprobs import mask_padded_vocab
from verl_bridge.runtime.schedule import cpu_forward_backward_no_pipelining, get_forward_backward_func


def forward_micro_batches(model, batches: list[Experience], loss_fn, *, pp_size: int, forward_only: bool) -> list[dict]:
    """``loss_fn(mb, output) -> (loss, stats)`` on each micro-batch; returns the stats of each."""
    fb = (cpu_forward_backward_no_pipelining if getattr(model, "runs_outside_megatron_schedule", False)
          else get_forward_backward_func(pp_size))

    def forward_step(data_iterator, module):
        mb = next(data_iterator)
        ids, pos, mask = model_inputs(mb.input_ids, mb.attention_mask)
        out = module(ids, pos, mask)
        return out, partial(loss_fn, mb)

    seq = batches[0].input_ids.shape[1]
    return fb(forward_step_func=forward_step, data_iterator=iter(batches), model=[model],
              num_microbatches=len(batches), seq_length=seq, micro_batch_size=batches[0].size,
              forward_only=forward_only)


def response_logits(output: torch.Tensor, mb: Experience, temperature: float, vocab_size=None) -> torch.Tensor:
    """fp32 logits over ``mb``'s response tokens, divided by the sampling temperature (when not 0 or 1),
    megatron's vocabulary padding (ids >= ``vocab_size``) masked out as the samplers do."""
    logits = response_slice(output, mb.prompt_len, mb.response_ids.shape[1])
    t = temperature
    logits = logits.float() / t if t and t != 1.0 else logits.float()
    return mask_padded_vocab(logits, vocab_size)


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
    return response_slice(output, mb.prompt_len, mb.response_ids.shape[1]).squeeze(-1).float()
