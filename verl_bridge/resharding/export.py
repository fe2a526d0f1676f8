"""Streaming, bucketed export of a TP/PP-sharded megatron-core model as full Hugging Face tensors.

Every rank of the TP x PP world builds a :class:`WeightExporter` over its own model chunk(s) and
iterates it at the same time; each rank receives every full, HF-named tensor. Per megatron
parameter, in one global order all ranks know:

1. the pipeline stage that owns it broadcasts each TP rank's shard over the PP group (ranks of
   other stages receive into a buffer of the shape learned from the one-off metadata exchange);
2. the TP shards are all-gathered over megatron's TP group and merged (:func:`merge_tp`);
3. :func:`mcore_to_hf` splits fused QKV (by query groups) and gate/up, drops the vocabulary
   padding, and skips the output layer of a tied model.

The order is config arithmetic (:func:`mcore_names` of the detected architecture); which stage
owns a name and the shard shapes come from one small ``all_gather_object`` over the PP group the
first time the stream is used (so VPP chunks and uneven stage layouts work too).

Memory: the exporter never holds more than one bucket of outputs plus the parameter in flight.
A parameter is converted only after the pending bucket is yielded if adding it could overflow
``bucket_bytes``; once the consumer resumes the generator, the bucket's tensors are dropped.
``stats.peak_extra_bytes`` is *measured*: at each step the exporter adds up the distinct storages
it holds (received shards, gather buffers, merged tensor, split outputs, pending bucket), leaving
out storages that belong to the model itself (a TP=1 owner streams its parameters without a
copy). The bound is ``max(bucket_bytes, F) + F`` where ``F`` is the largest full megatron tensor
(a tensor bigger than a bucket is its own bucket, plus one tensor in flight).

Yielded tensors may alias the model's parameters (zero copy) and must be treated as read-only;
clone them to keep them past the next training step. A yielded bucket list is emptied when the
consumer asks for the next one (so that a ``for bucket in ...`` loop does not keep two buckets
alive): copy what you want to keep (``[(n, t.clone()) for n, t in bucket]``) inside the loop body.
Every rank of the TP x PP world must iterate the stream to its end (it is a sequence of
collectives); the stream can be iterated again after every training step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator, Optional, Union

import torch
import torch.distributed as dist

from verl_bridge.arch.convert import (
    ModelDims,
    dims_of,
    hf_sources,
    mcore_names,
    mcore_to_hf,
    merge_tp,
    to_global_name,
    tp_split_dim,
)
from verl_bridge.arch.registry import ArchSpec, detect_architecture, get_arch
from verl_bridge.compat import unwrap_model


@dataclass
class ExportStats:
    bytes: int = 0  # bytes of HF tensors produced
    tensors: int = 0
    buckets: int = 0
    peak_extra_bytes: int = 0  # measured peak of storages the exporter held (model storage excluded)
    seconds: float = 0.0  # time spent inside the exporter (consumer time between yields excluded)

    @property
    def gbps(self) -> float:
        """Export throughput in GB/s (1e9 bytes per second)."""
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


# Transformer Engine layer specs fuse the pre-attention / pre-MLP norms into the next linear layer;
# the architecture maps use the local spec's names. Norm weights are replicated across TP.
_TE_NORM_ALIASES = (
    (".self_attention.linear_qkv.layer_norm_weight", ".input_layernorm.weight"),
    (".self_attention.linear_qkv.layer_norm_bias", ".input_layernorm.bias"),
    (".mlp.linear_fc1.layer_norm_weight", ".pre_mlp_layernorm.weight"),
    (".mlp.linear_fc1.layer_norm_bias", ".pre_mlp_layernorm.bias"),
)


def local_spec_name(name: str) -> str:
    """The local-spec name of a megatron parameter (TE fused-norm names mapped back)."""
    for te, local in _TE_NORM_ALIASES:
        if name.endswith(te):
            return name[: -len(te)] + local
    return name


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class _Ledger:
    """Measured live bytes: distinct storages held by the exporter, model storage left out."""

    def __init__(self, model_ptrs: set[int]):
        self.model_ptrs = model_ptrs
        self.peak = 0

    def mark(self, *groups, bucket: Optional["_Held"] = None) -> int:
        """Live bytes = distinct non-model storages in ``groups`` + what the pending bucket holds."""
        seen: dict[int, int] = {}
        held = bucket.ptrs if bucket is not None else {}
        for group in groups:
            for t in group:
                if t is None:
                    continue
                st = t.untyped_storage()
                ptr = st.data_ptr()
                if ptr in self.model_ptrs or ptr in seen or ptr in held:
                    continue
                seen[ptr] = st.nbytes()
        live = sum(seen.values()) + (bucket.total if bucket is not None else 0)
        self.peak = max(self.peak, live)
        return live


class _Held:
    """Distinct non-model storages of the pending bucket, kept incrementally (O(1) per tensor)."""

    def __init__(self, model_ptrs: set[int]):
        self.model_ptrs = model_ptrs
        self.ptrs: dict[int, int] = {}
        self.total = 0

    def add(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr not in self.model_ptrs and ptr not in self.ptrs:
            self.ptrs[ptr] = st.nbytes()
            self.total += st.nbytes()

    def clear(self) -> None:
        self.ptrs.clear()
        self.total = 0


def _parallel_state():
    """(tp_size, tp_rank, tp_group, pp_size, pp_rank, pp_group, pp_ranks)."""
    try:
        from megatron.core import parallel_state as mpu

        if mpu.model_parallel_is_initialized():
            tp_group = mpu.get_tensor_model_parallel_group()
            pp_group = mpu.get_pipeline_model_parallel_group()
            pp_size = mpu.get_pipeline_model_parallel_world_size()
            pp_ranks = dist.get_process_group_ranks(pp_group) if pp_size > 1 else [dist.get_rank()]
            return (mpu.get_tensor_model_parallel_world_size(), mpu.get_tensor_model_parallel_rank(), tp_group,
                    pp_size, mpu.get_pipeline_model_parallel_rank(), pp_group, pp_ranks)
    except Exception:  # noqa: BLE001 - no megatron state: a world of one
        pass
    return 1, 0, None, 1, 0, None, [0]


class WeightExporter:
    """Full, HF-named tensors of a (TP/PP/VPP-sharded) megatron-core GPTModel, streamed in buckets.

    ``model_chunks``: this rank's GPTModel, or a list of them (virtual pipeline chunks).
    ``arch``: architecture name or :class:`ArchSpec` (default: :func:`detect_architecture`).
    ``bucket_bytes``: upper bound on a bucket's bytes (``rollout.bucket_mb << 20``).
    ``dtype``: cast shards to this dtype before they move (e.g. ``torch.bfloat16``).
    ``vocab_size``: the unpadded (HF) vocabulary; rows past it are dropped. Default: the model's
    ``hf_vocab_size`` attribute if set, else the padded vocabulary is kept.
    ``checksum``: fill ``self.checksums`` (HF name -> fingerprint, see
    :func:`verl_bridge.rollout.verify.tensor_checksums`) on the sending side during export.
    ``hf_extras``: HF data megatron has no place for (OPT's leading position rows).
    """

    def __init__(self, model_chunks, *, arch: Union[str, ArchSpec, None] = None, bucket_bytes: int = 256 << 20,
                 dtype: Optional[torch.dtype] = None, vocab_size: Optional[int] = None, checksum: bool = False,
                 hf_extras: Optional[dict] = None):
        chunks = model_chunks if isinstance(model_chunks, (list, tuple)) else [model_chunks]
        if not chunks:
            raise ValueError("WeightExporter needs at least one model chunk")
        self.chunks = [unwrap_model(c) for c in chunks]
        first = self.chunks[0]
        self.spec = get_arch(arch if arch is not None else detect_architecture(first))
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
        self.bucket_bytes = int(bucket_bytes)
        self.dtype = dtype
        padded = getattr(first, "vocab_size", None)
        vocab = vocab_size if vocab_size is not None else getattr(first, "hf_vocab_size", None)
        base = dims_of(first.config)
        self.dims = ModelDims(**{**base.__dict__, "vocab_size": vocab if vocab is not None else padded,
                                 "padded_vocab_size": padded,
                                 "tie_embeddings": bool(getattr(first, "share_embeddings_and_output_weights",
                                                                base.tie_embeddings))})
        self.order = mcore_names(self.spec, self.dims)
        self.checksum = checksum
        self.checksums: dict[str, float] = {}
        self.hf_extras = hf_extras
        self.stats = ExportStats()
        self._meta: Optional[dict] = None  # global name -> (owner pp rank, shard shape, dtype)

    # ---- names ----------------------------------------------------------------------------
    def hf_names(self) -> list[str]:
        """Every HF name the stream produces, in order (pure arithmetic, no communication)."""
        out = []
        for name in self.order:
            if name == "output_layer.weight" and self.dims.tie_embeddings:
                continue
            out += hf_sources(name, self.spec)
        return out

    def _local_tensors(self) -> dict[str, torch.Tensor]:
        """Global megatron name -> this rank's (TP-shard) tensor, over all chunks."""
        known = set(self.order)
        local: dict[str, torch.Tensor] = {}
        for chunk in self.chunks:
            layers = getattr(getattr(chunk, "decoder", None), "layers", None)
            offset = (layers[0].layer_number - 1) if layers is not None and len(layers) else 0
            for lname, t in chunk.state_dict(keep_vars=True).items():
                if lname.endswith("._extra_state") or t is None:
                    continue
                g = local_spec_name(to_global_name(lname, offset))
                if g == "output_layer.weight" and self.dims.tie_embeddings:
                    continue  # the last stage's copy of the tied embeddings
                if g not in known:
                    raise ValueError(f"parameter {lname} (global {g}) is not in the {self.spec.name} "
                                     "architecture map; register an architecture that maps it")
                local[g] = t.detach()
        return local

    def _cached_local(self) -> tuple[dict[str, torch.Tensor], set[int]]:
        """Local tensors and the model's storage pointers, rebuilt only when a parameter moved.

        Walking ``state_dict`` costs milliseconds per sync on a 24-layer model; the parameters are
        updated in place between syncs, so their objects and storages normally stay the same.
        """
        if all(isinstance(c, torch.nn.Module) for c in self.chunks):
            key = tuple(p.data_ptr() for c in self.chunks for p in c.parameters())
        else:  # duck-typed chunks (anything with state_dict): no cache
            key = object()
        if getattr(self, "_local_key", None) != key:
            local = self._local_tensors()
            ptrs = {t.untyped_storage().data_ptr() for c in self.chunks
                    for t in c.state_dict(keep_vars=True).values() if isinstance(t, torch.Tensor)}
            self._local_cache, self._local_key = (local, ptrs), key
        return self._local_cache

    def _metadata(self) -> dict:
        """Owner stage, shard shape and dtype of every name (one all_gather_object over PP)."""
        if self._meta is not None:
            return self._meta
        _, _, _, pp_size, _, pp_group, _ = _parallel_state()
        mine = {g: (tuple(t.shape), t.dtype) for g, t in self._local_tensors().items()}
        if pp_size > 1:
            stages: list = [None] * pp_size
            dist.all_gather_object(stages, mine, group=pp_group)
        else:
            stages = [mine]
        meta = {}
        for p, entries in enumerate(stages):
            for g, (shape, dt) in entries.items():
                if g in meta:
                    raise ValueError(f"{g} is held by pipeline stages {meta[g][0]} and {p}")
                meta[g] = (p, shape, dt)
        missing = [g for g in self.order if g not in meta]
        if missing:
            raise ValueError(f"no pipeline stage holds {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        self._meta = meta
        return meta

    # ---- streaming ------------------------------------------------------------------------
    def _full_bytes(self, name: str, shape, dt, tp_size: int) -> int:
        n = 1
        for s in shape:
            n *= s
        if tp_split_dim(name) is not None:
            n *= tp_size
        esize = torch.empty((), dtype=self.dtype or dt).element_size()
        return n * esize

    def _convert(self, name, local, meta, ps, ledger, held) -> list[tuple[str, torch.Tensor]]:
        tp_size, tp_rank, tp_group, pp_size, pp_rank, pp_group, pp_ranks = ps
        owner, shape, dt = meta[name]
        dt = self.dtype or dt
        if owner == pp_rank:
            shard = local[name]
            if shard.dtype != dt:
                shard = shard.to(dt)
            shard = shard.contiguous()
        else:
            shard = torch.empty(shape, dtype=dt, device=self._device)
        if pp_size > 1:
            dist.broadcast(shard, src=pp_ranks[owner], group=pp_group)
        if tp_size > 1 and tp_split_dim(name) is not None:
            shards = [shard if r == tp_rank else torch.empty_like(shard) for r in range(tp_size)]
            dist.all_gather(shards, shard, group=tp_group)
            ledger.mark(shards, bucket=held)
            merged = merge_tp(name, shards, self.dims)
            ledger.mark(shards, [merged], bucket=held)
            del shards
        else:
            merged = shard
        del shard
        outs = mcore_to_hf(name, merged, self.spec, self.dims, extras=self.hf_extras)
        used: dict[int, int] = {}
        for _, t in outs:
            ptr = t.untyped_storage().data_ptr()
            used[ptr] = used.get(ptr, 0) + _nbytes(t)
        fixed = []
        for hf_name, t in outs:
            st = t.untyped_storage()
            if st.data_ptr() not in ledger.model_ptrs and st.nbytes() > used[st.data_ptr()]:
                # a view into a larger buffer (vocabulary padding dropped): keep only what is needed
                ledger.mark([merged, t], bucket=held)
                t = t.clone()
            fixed.append((hf_name, t))
        ledger.mark([merged], [t for _, t in fixed], bucket=held)
        del merged, outs
        return fixed

    def _stream(self, bucketed: bool) -> Iterator[list[tuple[str, torch.Tensor]]]:
        start = time.perf_counter()
        paused = 0.0
        ps = _parallel_state()
        meta = self._metadata()
        local, model_ptrs = self._cached_local()
        self._device = next(iter(local.values())).device if local else torch.device("cpu")
        ledger = _Ledger(model_ptrs)
        pending = _Held(model_ptrs)
        stats = ExportStats()
        self.stats = stats
        if self.checksum:
            from verl_bridge.rollout.verify import tensor_checksums
            self.checksums = {}
        bucket: list[tuple[str, torch.Tensor]] = []
        held = 0

        def emit(items):
            nonlocal paused
            stats.buckets += 1
            stats.peak_extra_bytes = max(stats.peak_extra_bytes, ledger.peak)
            stats.seconds = time.perf_counter() - start - paused
            t0 = time.perf_counter()
            yield items
            paused += time.perf_counter() - t0
            # the consumer asked for more: drop the tensors it was given, also from ITS reference to
            # the list (a `for bucket in ...` loop variable would otherwise keep the previous bucket
            # alive while the next one is built: two buckets instead of one)
            items.clear()

        for name in self.order:
            _, shape, dt = meta[name]
            est = self._full_bytes(name, shape, dt, ps[0])
            if bucketed and bucket and held + est > self.bucket_bytes:
                yield from emit(bucket)
                bucket, held = [], 0
                pending.clear()
            outs = self._convert(name, local, meta, ps, ledger, pending)
            for hf_name, t in outs:
                stats.tensors += 1
                stats.bytes += _nbytes(t)
                if self.checksum:
                    self.checksums.update(tensor_checksums([(hf_name, t)]))
            if not bucketed:
                if outs:
                    yield from emit(outs)
                del outs
                continue
            for item in outs:  # a parameter's parts (q/k/v, gate/up) may straddle buckets
                size = _nbytes(item[1])
                if bucket and held + size > self.bucket_bytes:
                    yield from emit(bucket)
                    bucket, held = [], 0
                    pending.clear()
                bucket.append(item)
                pending.add(item[1])
                held += size
            item = None
            del outs
        if bucket:
            yield from emit(bucket)
        del bucket
        stats.peak_extra_bytes = max(stats.peak_extra_bytes, ledger.peak)
        stats.seconds = time.perf_counter() - start - paused

    def iter_buckets(self) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Lists of ``(hf_name, tensor)`` whose bytes stay within ``bucket_bytes`` (a larger tensor alone)."""
        return self._stream(bucketed=True)

    def iter_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(hf_name, full tensor)`` one at a time, on every rank (only one parameter in flight)."""
        for items in self._stream(bucketed=False):
            yield from items

    def largest_tensor_bytes(self) -> int:
        """Bytes of the largest full megatron tensor (the ``F`` of the memory bound)."""
        meta = self._metadata()
        tp = _parallel_state()[0]
        return max(self._full_bytes(n, meta[n][1], meta[n][2], tp) for n in self.order)

    def export_state_dict(self) -> dict[str, torch.Tensor]:
        """Convenience for tests and small models: the whole stream as one dict (NOT bounded)."""
        return {n: t.clone() for n, t in self.iter_tensors()}


__all__ = ["ExportStats", "WeightExporter"]

