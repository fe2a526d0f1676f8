"""The native rollout engine: generate with the actor's own megatron-core model and a KV cache.

Pipeline per call: left-pad prompts -> prefill through ``GPTModel`` with a megatron
``StaticInferenceContext`` (its per-layer KV cache) -> decode one token at a time -> gather the
vocab-parallel logits of the last position across TP -> sample on TP rank 0 -> broadcast the
tokens to the TP group, so every TP rank holds identical samples -> stop when every row has
emitted EOS or ``max_new_tokens`` is reached.

The engine reads the actor's live parameters, so "weight sync" is a no-op apart from the
verification probe (see :mod:`verl_bridge.rollout.verify`). At PP > 1 it runs on a generation
replica (the whole model per TP group, refilled every step): :mod:`verl_bridge.rollout.replica`.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from verl_bridge.config.schema import DECODE_PATHS
from verl_bridge.rollout.base import RolloutBatch, SamplingParams, left_pad
from verl_bridge.rollout.sampling import sample_next, sampled_log_probs
from verl_bridge.common.batch import model_inputs


class NativeEngine:
    """Generate with the actor's megatron modules; on CUDA, with :mod:`.fast_decode` when it applies.

    ``decode`` (``rollout.decode``): ``auto`` (default) uses the CUDA-graph fast decoder on CUDA
    whenever :func:`~verl_bridge.rollout.fast_decode.unsupported_reason` finds nothing against the
    model, and the module path otherwise (CPU, TP>1, Transformer Engine specs, mixed dtypes, ...);
    ``fast`` requires the fast decoder (eager on CPU) and raises with the reason when it cannot run
    the model; ``module`` always generates through megatron's module forward. ``fast=True/False``
    (older keyword) is ``decode="fast"/"module"``. ``path`` says which one runs and, if not the fast
    decoder, ``fast_reason`` why.
    ``compile`` (``rollout.compile_decode``): compile the fast decoder's step with ``torch.compile``
    before graph capture (1.7x faster decode on an H200 in ``benchmarks/rollout.py``; the first
    generation of each shape pays the compilation).
    ``attention``: the fast decoder's decode-step attention, ``auto`` (the Triton GQA kernel of
    :mod:`verl_bridge.rollout.decode_attention` on CUDA, else SDPA), ``triton`` or ``sdpa``.
    """

    def __init__(self, model: torch.nn.Module, device: torch.device, fast: bool | None = None,
                 compile: bool = False, decode: str = "auto", memory_fraction: float | None = None,
                 attention: str = "auto"):
        self.model = model
        self.device = device
        self.fast = None
        from verl_bridge.rollout.fast_decode import FastEngine, unsupported_reason

        if fast is not None:
            decode = "fast" if fast else "module"
        if decode not in DECODE_PATHS:
            raise ValueError(f"rollout.decode={decode!r}: expected one of {', '.join(DECODE_PATHS)}")
        self.fast_reason = unsupported_reason(model)
        if decode == "module":
            self.fast_reason = "rollout.decode: module"
        elif decode == "fast" and self.fast_reason is not None:
            raise ValueError(f"rollout.decode=fast, but the fast decoder cannot run this model: {self.fast_reason}. "
                             "Use rollout.decode: auto (falls back to the module path) or module")
        elif decode == "auto" and device.type != "cuda" and self.fast_reason is None:
            self.fast_reason = "CPU (rollout.decode: auto uses the fast decoder on CUDA; fast forces it here too)"
        if self.fast_reason is None:
            self.fast = FastEngine(model, device, compile=compile, memory_fraction=memory_fraction, attention=attention)
        self.path = "fast" if self.fast is not None else "module"
        # algorithm.moe_routing_replay: record each MoE layer's expert choices (runtime/routing_replay.py)
        self.record_routing = False

    def sync_weights(self) -> None:  # shares the actor's parameters
        return None

    def probe_log_probs(self, input_ids: torch.Tensor, vocab_size: int | None, decode_steps: int = 3) -> torch.Tensor:
        """Next-token log-probs [B, S-1] of a probe batch through the path that generates: the fast
        decoder when it is in use, megatron's KV-cache forward otherwise (the sync check's engine side)."""
        from verl_bridge.rollout.verify import next_token_log_probs, native_engine_log_probs

        if self.fast is None:
            from verl_bridge.compat.cpu_device import cpu_device_shims

            with cpu_device_shims(), _sequence_parallel_off(self.model):
                return native_engine_log_probs(self.model, input_ids, vocab_size, decode_steps)
        ids = input_ids.to(self.device)
        steps = max(0, min(decode_steps, ids.shape[1] - 2))
        was_training = self.fast.decoder.model.training
        self.fast.decoder.model.eval()
        try:
            logits = self.fast.decoder.teacher_forced_logits(ids, steps)
        finally:
            self.fast.decoder.model.train(was_training)
        return next_token_log_probs(logits, ids, vocab_size).cpu()

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int) -> RolloutBatch:
        if self.fast is not None:
            return self.fast.generate(prompts, params, seed)
        from verl_bridge.compat.cpu_device import cpu_device_shims

        with cpu_device_shims(), _sequence_parallel_off(self.model):  # CPU-only allocations; SP off to decode
            return self._generate_module(prompts, params, seed)

    def _generate_module(self, prompts: list[list[int]], params: SamplingParams, seed: int) -> RolloutBatch:
        from megatron.core import parallel_state as mpu
        from megatron.core.inference.contexts import StaticInferenceContext

        model = self.model
        was_training = model.training
        model.eval()
        dev = self.device
        prompt_ids, prompt_mask = left_pad(prompts, params.pad_token_id, dev)
        bsz, plen = prompt_ids.shape
        total = plen + params.max_new_tokens
        ctx = StaticInferenceContext(max_batch_size=bsz, max_sequence_length=total)
        tp_group = mpu.get_tensor_model_parallel_group()
        tp_size = mpu.get_tensor_model_parallel_world_size()
        src = mpu.get_tensor_model_parallel_src_rank() if tp_size > 1 else None
        gen = torch.Generator(device=dev)
        gen.manual_seed(seed)
        from verl_bridge.compat import unwrap_model

        vocab = getattr(unwrap_model(model), "hf_vocab_size", None)

        # prefill uses the training forward's inputs (causal + key padding, pads see themselves)
        _, positions, mask = model_inputs(prompt_ids, prompt_mask)
        recorder = None
        if self.record_routing:
            from verl_bridge.common.routing_replay import RoutingRecorder

            recorder = RoutingRecorder(model)
        try:
            return self._decode(model, recorder, ctx, prompt_ids, prompt_mask, positions, mask, params, gen, vocab,
                                tp_size, tp_group, src, was_training)
        finally:
            if recorder is not None:
                recorder.close()

    def _decode(self, model, recorder, ctx, prompt_ids, prompt_mask, positions, mask, params, gen, vocab,
                tp_size, tp_group, src, was_training) -> RolloutBatch:
        dev = self.device
        bsz, plen = prompt_ids.shape
        total = plen + params.max_new_tokens
        # decode steps extend this key-padding mask: True = masked out (megatron convention)
        key_pad = torch.zeros((bsz, total), dtype=torch.bool, device=dev)
        key_pad[:, :plen] = prompt_mask == 0
        logits = model(prompt_ids, positions, mask, inference_context=ctx, runtime_gather_output=True)
        if recorder is not None:
            recorder.step(bsz)
        ctx.sequence_len_offset += plen
        last_pos = positions[:, -1]

        response = torch.full((bsz, params.max_new_tokens), params.pad_token_id, dtype=torch.long, device=dev)
        resp_mask = torch.zeros((bsz, params.max_new_tokens), dtype=torch.long, device=dev)
        resp_lp = torch.zeros((bsz, params.max_new_tokens), dtype=torch.float32, device=dev)
        done = torch.zeros(bsz, dtype=torch.bool, device=dev)
        for t in range(params.max_new_tokens):
            full = logits[:, -1, :]  # megatron gathers TP logits in inference mode
            if vocab is not None and vocab < full.shape[-1]:
                full = full[:, :vocab]  # never sample megatron's vocabulary padding rows
            tok = sample_next(full, params.temperature, params.top_p, params.top_k, generator=gen)
            if tp_size > 1:
                dist.broadcast(tok, src=src, group=tp_group)
            lp = sampled_log_probs(full, tok, params.temperature, params.top_p, params.top_k)
            tok = torch.where(done, torch.full_like(tok, params.pad_token_id), tok)
            response[:, t] = tok
            resp_mask[:, t] = (~done).long()
            resp_lp[:, t] = torch.where(done, torch.zeros_like(lp), lp)
            if params.eos_token_id is not None:
                done = done | (tok == params.eos_token_id)
            if bool(done.all()) or t == params.max_new_tokens - 1:
                break
            ctx.enable_decode_mode()
            step_pos = (last_pos + 1 + t).unsqueeze(1)
            key_pad[:, plen + t] = False
            step_mask = key_pad[:, None, None, : plen + t + 1]
            logits = model(tok.unsqueeze(1), step_pos, step_mask, inference_context=ctx,
                           runtime_gather_output=True)
            if recorder is not None:
                recorder.step(bsz)
            ctx.sequence_len_offset += 1
        routed = None
        if recorder is not None:  # route the last sampled token too (its logits are not needed)
            ctx.enable_decode_mode()
            key_pad[:, plen + t] = False
            model(tok.unsqueeze(1), (last_pos + 1 + t).unsqueeze(1), key_pad[:, None, None, : plen + t + 1],
                  inference_context=ctx, runtime_gather_output=True)
            recorder.step(bsz)
            routed = recorder.result(bsz, total, dev)
        if was_training:
            model.train()
        return RolloutBatch(prompt_ids, prompt_mask, response, resp_mask, log_probs=resp_lp, routed_experts=routed)


@contextlib.contextmanager
def _sequence_parallel_off(model: torch.nn.Module):
    """Sequence parallelism switched off for the duration of a generation (megatron's
    ``set_model_to_sequence_parallel``, as the PP generation replicas do): a decode step's one token per
    sequence cannot be split over TP ("First dimension of the tensor should be divisible by tensor
    parallel size"). Restored afterwards for training. A no-op without SP."""
    from verl_bridge.compat import unwrap_model

    inner = unwrap_model(model)
    config = getattr(inner, "config", None)
    if not getattr(config, "sequence_parallel", False) or getattr(config, "tensor_model_parallel_size", 1) <= 1:
        yield
        return
    from megatron.core.transformer.utils import set_model_to_sequence_parallel

    set_model_to_sequence_parallel(inner, set_to=False)
    try:
        yield
    finally:
        set_model_to_sequence_parallel(inner, set_to=True)
