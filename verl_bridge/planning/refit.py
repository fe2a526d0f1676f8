"""Refit (weight sync) plan: what one actor -> rollout sync moves, in how many buckets, how fast.

Pipeline of one sync (issue #5): broadcast each parameter from its pipeline stage -> TP
all-gather -> convert to HF names/layout -> pack into buckets of ``rollout.bucket_mb`` MiB ->
hand to the rollout engine. Every rank streams the full model through the exporter (its rollout
engine keeps its own rollout-TP shard), so per sync and per rank:

* bytes moved = every full HF tensor in the rollout dtype (``trainer.precision``);
* buckets = the exporter's packing rule replayed on the shape (:func:`count_buckets`): before each
  megatron tensor the pending bucket is sent if the tensor's full size could overflow it, then each
  HF piece (q/k/v, gate/up) is added, sending the bucket first when it would overflow;
* peak extra memory = the exporter's bound: at TP=1 / PP=1 (its fast path) ``max(bucket, F) + F``,
  F the largest full megatron tensor (one bucket, or one tensor larger than a bucket, plus the tensor
  being gathered); at TP>1 or PP>1 (its coalesced general path) its two buffers, replayed on the
  shape (:func:`coalesced_peak_bytes`): the largest gathered unit of buckets plus the largest bucket;
* time = bytes / bandwidth, the bandwidth given (``--bandwidth-gbps``, Gbit/s) or measured here by a
  timed device-to-device tensor copy (on CPU a memory copy: a lower bound on no interconnect).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Optional

from verl_bridge.planning.memory import DTYPE_BYTES, fmt_gib
from verl_bridge.planning.shapes import ModelShape, stream_entries

MiB = 1024 ** 2


@dataclass
class RefitPlan:
    bytes_per_sync: int
    tensors: int
    bucket_bytes: int
    buckets: int
    largest_tensor: str
    largest_tensor_bytes: int
    peak_extra_bytes: int
    bandwidth_bytes_per_s: Optional[float]
    bandwidth_source: str
    seconds: Optional[float]
    export_path: str = "fast"  # the exporter's path at this layout: fast (TP=1 / PP=1) or coalesced

    def to_dict(self) -> dict:
        return asdict(self)


def count_buckets(entries: list[tuple[str, int, list[int]]], bucket: int) -> int:
    """Buckets :meth:`WeightExporter.iter_buckets` sends for ``(name, full bytes, [piece bytes])`` entries."""
    from verl_bridge.resharding.export import assign_buckets

    return len(assign_buckets([(full, pieces) for _, full, pieces in entries], bucket))


# tensors every TP rank holds whole (the coalesced exporter gathers TP copies of them)
_REPLICATED = ("norm.weight", "norm.bias", "linear_proj.bias", "linear_fc2.bias", "position_embeddings")


def coalesced_peak_bytes(entries: list[tuple[str, int, list[int]]], bucket: int, tp: int) -> int:
    """The coalesced exporter's two buffers for ``(name, full bytes, [piece bytes])`` entries: the
    gather buffer of the largest unit of buckets (buckets linked by a tensor that straddles them; TP
    copies of replicated tensors) plus the output buffer of the largest bucket (an upper bound: the
    HF tensors that are views of the gather buffer take none)."""
    from verl_bridge.resharding.export import assign_buckets

    def gathered(i):
        name, full, _ = entries[i]
        return full * (tp if tp > 1 and name.endswith(_REPLICATED) else 1)

    g = o = 0
    unit: set = set()
    last = -1
    for b in assign_buckets([(full, pieces) for _, full, pieces in entries], bucket):
        if b[0][0] != last:
            g, unit = max(g, sum(gathered(i) for i in unit)), set()
        unit |= {i for i, _ in b}
        last = b[-1][0]
        o = max(o, sum(entries[i][2][j] for i, j in b))
    return max(g, sum(gathered(i) for i in unit)) + o


def measure_copy_bandwidth(mib: int = 64, repeats: int = 5) -> tuple[float, str]:
    """Bytes/s of a tensor copy on this machine's device (CUDA when present, else CPU memory)."""
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    src = torch.empty(mib * MiB, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up
    if dev == "cuda":
        torch.cuda.synchronize()
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        if dev == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    what = (f"measured: {mib} MiB copy on {torch.cuda.get_device_name(0)}" if dev == "cuda"
            else f"measured: {mib} MiB memory copy on this machine's CPU (no GPU here; real syncs cross NVLink/PCIe)")
    return src.numel() / best, what


def plan_refit(shape: ModelShape, precision: str, bucket_mb: float, bandwidth_gbps: Optional[float] = None,
               measure: bool = False, tp: int = 1, pp: int = 1) -> RefitPlan:
    """``tp``: the training TP size (the vocabulary padding of the gathered embedding depends on it);
    ``tp`` and ``pp`` decide the exporter's path (fast at TP=1 / PP=1, coalesced otherwise)."""
    nbytes = DTYPE_BYTES.get(precision, 4)
    entries = [(name, full * nbytes, [p * nbytes for p in pieces]) for name, full, pieces in stream_entries(shape, tp)]
    total = sum(sum(pieces) for _, _, pieces in entries)
    bucket = int(bucket_mb * MiB)
    largest_name, largest, _ = max(entries, key=lambda e: e[1])
    if bandwidth_gbps:
        bw, source = bandwidth_gbps * 1e9 / 8, f"given: {bandwidth_gbps:g} Gbit/s"
    elif measure:
        bw, source = measure_copy_bandwidth()
    else:
        bw, source = None, "not given (--bandwidth-gbps) nor measured"
    return RefitPlan(
        bytes_per_sync=total, tensors=sum(len(pieces) for _, _, pieces in entries), bucket_bytes=bucket,
        buckets=count_buckets(entries, bucket), largest_tensor=largest_name, largest_tensor_bytes=largest,
        peak_extra_bytes=(max(min(bucket, total), largest) + largest  # a bucket never holds more than the model
                          if tp == 1 and pp == 1 else coalesced_peak_bytes(entries, bucket, tp)),
        bandwidth_bytes_per_s=bw, bandwidth_source=source, seconds=(total / bw) if bw else None,
        export_path="fast" if tp == 1 and pp == 1 else "coalesced",
    )


def refit_lines(plan: RefitPlan, precision: str) -> list[str]:
    lines = [
        f"refit           {fmt_gib(plan.bytes_per_sync)} per sync ({plan.tensors} HF tensors in {precision}); "
        f"{plan.buckets} bucket(s) of {plan.bucket_bytes / MiB:g} MiB (rollout.bucket_mb)",
        f"                peak extra memory/rank {fmt_gib(plan.peak_extra_bytes)} = "
        + ("max(bucket, F) + F" if plan.export_path == "fast" else "a gather + an output buffer, ~max(bucket, F) each")
        + f", F the largest gathered tensor ({plan.largest_tensor}, {fmt_gib(plan.largest_tensor_bytes)})",
    ]
    if plan.seconds is not None:
        t = f"{plan.seconds:.3f} s" if plan.seconds >= 0.1 else f"{plan.seconds * 1e3:.3f} ms"
        lines.append(f"                estimated sync time {t} at {plan.bandwidth_bytes_per_s / 1e9:.1f} "
                     f"GB/s ({plan.bandwidth_source})")
    else:
        lines.append(f"                sync time: bandwidth {plan.bandwidth_source}")
    return lines
