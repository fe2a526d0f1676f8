"""Weight-sync verification: after every sync, the rollout engine must score like the trainer.

Two independent signals:

* **log-probs on a probe batch** (:func:`verify_sync`): the trainer's and the engine's
  per-token log-probs of a small fixed batch must agree within ``rollout.verify_threshold``;
* **per-tensor checksums** (:func:`tensor_checksums`), computed on the sending side during export
  (``WeightExporter(..., checksum=True)``) and on the receiving side after loading: the names
  whose fingerprints differ are the suspects the error message names.

A mismatch raises :class:`SyncVerificationError`, whose message gives the max/mean absolute
log-prob difference, the threshold, how to relax or disable the check, and the suspect
parameters. :func:`probe_sync` runs the whole check for a megatron actor and any receiver that
can score tokens (a ``transformers`` model on CPU; vLLM's prompt log-probs on GPU).
:func:`verify_native_engine` is the native engine's check: it shares the actor's parameters, so
it compares the trainer's forward with the engine's own KV-cache path (prefill + decode steps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Optional, Union

import torch

NamedTensors = Union[Mapping[str, torch.Tensor], Iterable[tuple[str, torch.Tensor]]]

_CHUNK = 1 << 22  # elements per step (32 MiB of float64)
_WEIGHT_PERIOD = 7919  # prime: position weights 1/P .. 1, so permuted or shifted elements change the sum


def _items(named: NamedTensors):
    return named.items() if isinstance(named, Mapping) else named


@torch.no_grad()
def tensor_checksums(named_tensors: NamedTensors) -> dict[str, float]:
    """Cheap per-tensor fingerprints: ``sum(x) + pi * sum(x * w)`` in float64, ``w`` a position weight.

    The plain sum catches scaling and noise, the position-weighted sum catches permuted or
    shifted elements (e.g. a wrong QKV split). Computed the same way on both sides of a sync.
    """
    out = {}
    for name, t in _items(named_tensors):
        flat = t.detach().reshape(-1)
        plain = weighted = None
        # in chunks: the float64 temporaries stay small however big the tensor (export memory bound)
        for start in range(0, flat.numel(), _CHUNK):
            x = flat[start:start + _CHUNK].double()
            w = torch.arange(start, start + x.numel(), dtype=torch.int64, device=x.device)
            w = (w % _WEIGHT_PERIOD + 1).double().div_(_WEIGHT_PERIOD)
            s, ws = x.sum(), w.mul_(x).sum()
            plain, weighted = (s, ws) if plain is None else (plain + s, weighted + ws)
        out[name] = 0.0 if plain is None else float(plain) + math.pi * float(weighted)
    return out


def checksums_of_fused(fused: torch.Tensor, parts: Iterable[tuple[str, int]], dim: int = 0) -> dict[str, float]:
    """Receiver-side fingerprints of HF tensors an engine keeps fused (vLLM's ``qkv_proj`` = [q; k; v],
    ``gate_up_proj`` = [gate; up]): *parts* are ``(hf_name, size along dim)`` in order. Matches
    :func:`tensor_checksums` of the separate tensors."""
    parts = list(parts)
    sizes = [n for _, n in parts]
    if sum(sizes) != fused.shape[dim]:
        raise ValueError(f"parts {parts} do not add up to the fused size {fused.shape[dim]} along dim {dim}")
    pieces = torch.split(fused, sizes, dim=dim)
    return tensor_checksums((name, piece.contiguous()) for (name, _), piece in zip(parts, pieces))


def compare_checksums(sender: Mapping[str, float], receiver: Mapping[str, float], *,
                      rel_tol: float = 1e-6, abs_tol: float = 1e-6) -> list[str]:
    """Sender names whose receiver fingerprint differs or is missing, in sender order."""
    suspects = []
    for name, s in sender.items():
        r = receiver.get(name)
        if r is None or not math.isclose(s, r, rel_tol=rel_tol, abs_tol=abs_tol):
            suspects.append(name)
    return suspects


@dataclass
class SyncReport:
    max_abs_diff: float
    mean_abs_diff: float
    tokens: int
    threshold: float
    suspects: list[str] = field(default_factory=list)
    checksums_compared: bool = False

    @property
    def ok(self) -> bool:
        return self.max_abs_diff <= self.threshold and not self.suspects


class SyncVerificationError(RuntimeError):
    def __init__(self, message: str, report: SyncReport):
        super().__init__(message)
        self.report = report


def _message(r: SyncReport) -> str:
    within = r.max_abs_diff <= r.threshold
    parts = [
        f"Weight sync verification failed: the rollout engine's log-probs differ from the trainer's by "
        f"max {r.max_abs_diff:.3g} (mean {r.mean_abs_diff:.3g}) over {r.tokens} probe tokens; the threshold "
        f"(rollout.verify_threshold) is {r.threshold:g}"
        + (", so the probe passed but the weights the engine holds are not the ones sent." if within else ".")
    ]
    if r.suspects:
        shown = ", ".join(r.suspects[:10]) + (f" and {len(r.suspects) - 10} more" if len(r.suspects) > 10 else "")
        parts.append(f"Suspect parameters (receiver checksum differs from the sender's): {shown}.")
    elif r.checksums_compared:
        parts.append("Every parameter's checksum matched, so the difference comes from the engine's "
                     "computation (dtype, kernels) rather than from corrupted weights.")
    else:
        parts.append("No per-parameter checksums were available, so the suspect parameters cannot be named "
                     "(export with WeightExporter(..., checksum=True) and checksum the receiver to get them).")
    parts.append("If the difference is expected (e.g. a lower-precision engine), raise rollout.verify_threshold; "
                 "set rollout.verify_sync: false to turn the check off.")
    return " ".join(parts)


@torch.no_grad()
def verify_sync(trainer_log_probs: torch.Tensor, engine_log_probs: torch.Tensor, mask: Optional[torch.Tensor] = None,
                *, threshold: float, sender_checksums: Optional[Mapping[str, float]] = None,
                receiver_checksums: Optional[Mapping[str, float]] = None) -> SyncReport:
    """Compare log-probs (and checksums when both sides give them); raise :class:`SyncVerificationError`."""
    a = trainer_log_probs.detach().double().cpu()
    b = engine_log_probs.detach().double().cpu()
    if a.shape != b.shape:
        raise ValueError(f"trainer log-probs {tuple(a.shape)} and engine log-probs {tuple(b.shape)} differ in shape")
    m = torch.ones_like(a, dtype=torch.bool) if mask is None else mask.detach().cpu().bool()
    diff = (a - b).abs()[m]
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, math.inf), diff)  # NaN never passes
    tokens = int(diff.numel())
    max_d = float(diff.max()) if tokens else 0.0
    mean_d = float(diff.mean()) if tokens else 0.0
    compared = sender_checksums is not None and receiver_checksums is not None
    suspects = compare_checksums(sender_checksums, receiver_checksums) if compared else []
    report = SyncReport(max_d, mean_d, tokens, threshold, suspects, compared)
    if not report.ok:
        raise SyncVerificationError(_message(report), report)
    return report


# ---- probe batch and log-probs ------------------------------------------------------------

PROBE_SEQ_LEN = 16  # tokens per probe sequence (an engine's context must hold them)


def probe_input_ids(vocab_size: int, batch: int = 2, seq_len: int = PROBE_SEQ_LEN, seed: int = 1234) -> torch.Tensor:
    """A small fixed batch of token ids (the same on every rank and every step)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, seq_len), generator=g)


def _gather_vocab(logits: torch.Tensor) -> torch.Tensor:
    """Full-vocabulary logits from megatron's vocab-parallel output (no-op at TP=1)."""
    from megatron.core import parallel_state as mpu

    if not mpu.model_parallel_is_initialized() or mpu.get_tensor_model_parallel_world_size() == 1:
        return logits
    import torch.distributed as dist

    tp = mpu.get_tensor_model_parallel_world_size()
    parts = [torch.empty_like(logits) for _ in range(tp)]
    dist.all_gather(parts, logits.contiguous(), group=mpu.get_tensor_model_parallel_group())
    return torch.cat(parts, dim=-1)


def next_token_log_probs(logits: torch.Tensor, input_ids: torch.Tensor, vocab_size: Optional[int]) -> torch.Tensor:
    """log p(input_ids[:, t+1] | ..t) from logits [B, S, V] -> [B, S-1] (padded vocabulary dropped)."""
    if vocab_size is not None:
        logits = logits[..., :vocab_size]
    lp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return lp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


class _eval_mode:
    def __init__(self, model):
        self.model = model

    def __enter__(self):
        self.was = self.model.training
        self.model.eval()

    def __exit__(self, *exc):
        if self.was:
            self.model.train()


@torch.no_grad()
def megatron_log_probs(model, input_ids: torch.Tensor, vocab_size: Optional[int] = None) -> torch.Tensor:
    """The trainer's forward (PP=1, any TP): next-token log-probs [B, S-1] of *input_ids*."""
    from verl_bridge.common.batch import model_inputs

    device = next(model.parameters()).device
    ids = input_ids.to(device)
    ids, pos, mask = model_inputs(ids, torch.ones_like(ids))
    from verl_bridge.compat.cpu_device import cpu_device_shims

    with _eval_mode(model), cpu_device_shims():
        logits = _gather_vocab(model(ids, pos, mask))
    return next_token_log_probs(logits, ids, vocab_size).cpu()


@torch.no_grad()
def hf_log_probs(hf_model, input_ids: torch.Tensor, vocab_size: Optional[int] = None) -> torch.Tensor:
    """A ``transformers`` causal LM's next-token log-probs [B, S-1]."""
    device = next(hf_model.parameters()).device
    with _eval_mode(hf_model):
        logits = hf_model(input_ids=input_ids.to(device)).logits
    return next_token_log_probs(logits, input_ids.to(device), vocab_size).cpu()


@torch.no_grad()
def native_engine_log_probs(model, input_ids: torch.Tensor, vocab_size: Optional[int] = None,
                            decode_steps: int = 3) -> torch.Tensor:
    """Log-probs through the native engine's KV-cache path: prefill, then ``decode_steps`` single
    tokens (teacher-forced with the probe's own tokens), exactly as ``NativeEngine.generate`` calls
    the model."""
    from megatron.core.inference.contexts import StaticInferenceContext

    from verl_bridge.common.batch import model_inputs

    device = next(model.parameters()).device
    ids = input_ids.to(device)
    bsz, seq = ids.shape
    decode_steps = max(0, min(decode_steps, seq - 2))
    plen = seq - decode_steps
    ctx = StaticInferenceContext(max_batch_size=bsz, max_sequence_length=seq)
    ctx.materialize_only_last_token_logits = False  # the engine keeps only the last; the probe scores all
    with _eval_mode(model):
        p_ids, pos, mask = model_inputs(ids[:, :plen], torch.ones_like(ids[:, :plen]))
        chunks = [model(p_ids, pos, mask, inference_context=ctx, runtime_gather_output=True)]
        ctx.sequence_len_offset += plen
        key_pad = torch.zeros((bsz, seq), dtype=torch.bool, device=device)
        for t in range(decode_steps):
            ctx.enable_decode_mode()
            step_pos = torch.full((bsz, 1), plen + t, dtype=torch.long, device=device)
            step_mask = key_pad[:, None, None, : plen + t + 1]
            chunks.append(model(ids[:, plen + t: plen + t + 1], step_pos, step_mask, inference_context=ctx,
                                runtime_gather_output=True))
            ctx.sequence_len_offset += 1
    logits = torch.cat(chunks, dim=1)
    return next_token_log_probs(logits, ids, vocab_size).cpu()


# Default probe thresholds by the actor's parameter dtype. In fp32 two correct forward paths agree to
# ~1e-5; in bf16 the fast decoder and megatron's module forward (different kernels, same weights)
# differ by up to 0.02 in per-token log-probs on a 0.5B model (measured on an H200), while a
# wrong or missing tensor moves them by whole units.
DEFAULT_THRESHOLDS = {torch.float32: 1e-3, torch.float64: 1e-3}
LOW_PRECISION_THRESHOLD = 0.1


def resolve_threshold(configured: Optional[float], actor) -> float:
    """``rollout.verify_threshold`` if set, else the default for the actor's parameter dtype."""
    if configured is not None:
        return float(configured)
    from verl_bridge.compat import unwrap_model

    chunk = unwrap_model(actor[0] if isinstance(actor, (list, tuple)) else actor)
    dtype = next((p.dtype for p in chunk.parameters()), torch.float32)
    return DEFAULT_THRESHOLDS.get(dtype, LOW_PRECISION_THRESHOLD)


def probe_sync(actor, receiver_log_probs: Callable[[torch.Tensor], torch.Tensor], *, threshold: float,
               vocab_size: int, input_ids: Optional[torch.Tensor] = None,
               sender_checksums: Optional[Mapping[str, float]] = None,
               receiver_checksums: Optional[Mapping[str, float]] = None) -> SyncReport:
    """Score the probe batch with the megatron *actor* (PP=1) and the receiver; compare.

    *receiver_log_probs* maps input ids [B, S] to next-token log-probs [B, S-1] (e.g.
    ``lambda ids: hf_log_probs(hf_model, ids, vocab)``). Every TP rank of the actor must call this.
    """
    ids = probe_input_ids(vocab_size) if input_ids is None else input_ids
    trainer = megatron_log_probs(actor, ids, vocab_size)
    engine = receiver_log_probs(ids)
    return verify_sync(trainer, engine, None, threshold=threshold, sender_checksums=sender_checksums,
                       receiver_checksums=receiver_checksums)


def verify_native_engine(model, *, threshold: float, vocab_size: Optional[int] = None,
                         input_ids: Optional[torch.Tensor] = None, engine=None) -> Optional[SyncReport]:
    """The native engine's sync check: trainer forward vs the engine's generation path on the probe.

    ``engine`` (a :class:`~verl_bridge.rollout.native.NativeEngine`) scores the probe through the
    path it generates with (its CUDA-graph fast decoder where that is in use); without it, megatron's
    KV-cache forward is checked. The probe vocabulary is the model's unpadded one where known (the
    engines never sample megatron's padding rows). Returns ``None`` (no check) where the native
    engine cannot run: pipeline parallel > 1.
    """
    from megatron.core import parallel_state as mpu

    from verl_bridge.compat import unwrap_model

    if mpu.model_parallel_is_initialized() and mpu.get_pipeline_model_parallel_world_size() > 1:
        return None
    inner = unwrap_model(model)
    vocab = vocab_size or getattr(inner, "hf_vocab_size", None) or getattr(inner, "vocab_size", None)
    ids = probe_input_ids(vocab) if input_ids is None else input_ids
    trainer = megatron_log_probs(model, ids, vocab)
    engine_lp = (engine.probe_log_probs(ids, vocab) if engine is not None
                 else native_engine_log_probs(model, ids, vocab))
    return verify_sync(trainer, engine_lp, None, threshold=threshold)


__all__ = [
    "SyncReport", "SyncVerificationError", "checksums_of_fused", "compare_checksums", "hf_log_probs", "megatron_log_probs",
    "native_engine_log_probs", "probe_input_ids", "probe_sync", "tensor_checksums", "verify_native_engine",
    "verify_sync",
]
