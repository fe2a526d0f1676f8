"""Weight-sync bandwidth: the bucketed megatron -> HF-named export vs a plain device copy, one run.

Model: Qwen2-0.5B's shape, random weights, bf16 on CUDA, TP=1 (one GPU). The export streams every
HF-named tensor (QKV split by query groups, gate/up split, tied embeddings handled) in buckets of
``--bucket-mb`` and the consumer copies each into a preallocated HF-layout buffer, as a rollout
engine's ``load_weights`` does, with one batched ``torch._foreach_copy_`` per bucket and dtype (a per-tensor
consumer and the exporter's general path, the code TP>1 / PP>1 runs, are measured too: coalesced, as
``fast_path=False`` now runs it, and per tensor, as it ran before). ``export_GBps`` = HF bytes delivered /
wall time of export + consumer copies. ``copy_GBps`` = bytes / time of one device ``copy_`` of the same number of bytes
(each byte counted once). ``ratio`` = export / copy. Peak extra memory is the exporter's measured
figure (see :mod:`verl_bridge.resharding.export`).

    python benchmarks/weight_export.py     # writes benchmarks/results/weight_export-<device>.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import _common as C  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--bucket-mb", type=int, default=256)
    args = ap.parse_args(argv)
    dev = C.device()
    small = args.small or dev.type == "cpu"
    shape = C.QWEN2_TINY if small else C.QWEN2_05B
    dtype = torch.float32 if dev.type == "cpu" else torch.bfloat16

    from verl_bridge.distributed import init_model_parallel, seed_everything
    from verl_bridge.resharding.export import WeightExporter

    init_model_parallel(1, 1)
    seed_everything(0)  # also megatron's CUDA RNG tracker, which GPU initialisation needs
    tmp = tempfile.mkdtemp(prefix="bench_export_")
    hf = C.make_hf_model(shape, tmp, dtype=dtype)
    expected = {k: v.to(dev) for k, v in hf.state_dict().items()}
    del hf
    mc = C.megatron_model(tmp, dtype, dev)
    bucket = args.bucket_mb << 20
    # dtype: the rollout side's dtype. megatron keeps the norm weights in fp32; they are cast on the way
    # out (a few small tensors), so every bucket reaches the consumer in one dtype
    ex = WeightExporter(mc, bucket_bytes=bucket, vocab_size=shape["vocab_size"], dtype=dtype)
    # the general path at TP=1: coalesced (pack, [broadcast / all-gather: none at TP=1 / PP=1], views or one
    # batched copy per bucket) and the per-tensor path it replaces
    coalesced = WeightExporter(mc, bucket_bytes=bucket, vocab_size=shape["vocab_size"], dtype=dtype, fast_path=False)
    general = WeightExporter(mc, bucket_bytes=bucket, vocab_size=shape["vocab_size"], dtype=dtype, fast_path=False,
                             coalesce=False)
    dst = {n: torch.empty_like(t) for n, t in expected.items() if n != "lm_head.weight" or not shape["tie_word_embeddings"]}

    def batched(exporter):
        """The consumer copies each bucket into the HF-layout buffers with one batched call per dtype."""
        n = 0
        for b in exporter.iter_buckets():
            groups: dict = {}
            for name, t in b:
                d, s = groups.setdefault(t.dtype, ([], []))
                d.append(dst[name])
                s.append(t)
                n += t.numel() * t.element_size()
            for d, s in groups.values():
                torch._foreach_copy_(d, s)
        return n

    def per_tensor(exporter):
        """The consumer copies tensor by tensor (as a Python ``load_weights`` loop does)."""
        n = 0
        for b in exporter.iter_buckets():
            for name, t in b:
                dst[name].copy_(t)
                n += t.numel() * t.element_size()
        return n

    variants = {"fast": (ex, batched), "fast_per_tensor": (ex, per_tensor), "general": (general, per_tensor),
                "general_coalesced": (coalesced, batched), "general_coalesced_per_tensor": (coalesced, per_tensor)}
    checks = {}
    for label, (exporter, consume) in variants.items():
        for t in dst.values():
            t.fill_(float("nan"))
        total = consume(exporter)  # warm-up (builds the fast path's plan), and the correctness check
        checks[label] = dict(missing=sorted(set(dst) - set(exporter.hf_names())),
                             wrong=[n for n in dst if n in expected and not torch.equal(dst[n], expected[n])][:10])
    times = {label: C.timed(lambda e=e, f=f: f(e), dev, repeat=10) for label, (e, f) in variants.items()}
    t = times["fast"]
    export_bps = total / t
    copy_bps = C.copy_bandwidth(dev, total)
    missing = sorted({n for c in checks.values() for n in c["missing"]})
    wrong = sorted({n for c in checks.values() for n in c["wrong"]})
    params = sum(p.numel() for p in mc.parameters())
    batched(coalesced)
    coalesced_stats = coalesced.stats
    batched(ex)  # once more for the exporter's own stats of the headline path
    results = {"export_GBps": export_bps / 1e9, "seconds_per_sync": t, "bytes_per_sync": total,
               "seconds_per_billion_params": t / (params / 1e9), "buckets": ex.stats.buckets,
               "peak_extra_bytes": ex.stats.peak_extra_bytes, "bucket_bytes": bucket,
               "exporter_only_GBps": ex.stats.gbps, "tensors": ex.stats.tensors,
               "per_tensor_consumer_GBps": total / times["fast_per_tensor"] / 1e9,
               "general_path_GBps": total / times["general"] / 1e9,
               "general_coalesced_GBps": total / times["general_coalesced"] / 1e9,
               "general_coalesced_per_tensor_consumer_GBps": total / times["general_coalesced_per_tensor"] / 1e9,
               "general_coalesced_exporter_only_GBps": coalesced_stats.gbps,
               "general_coalesced_peak_extra_bytes": coalesced_stats.peak_extra_bytes,
               "check_missing_names": missing, "check_mismatched_tensors": wrong}
    baseline = {"copy_GBps": copy_bps / 1e9}
    cfg = {"model": "qwen2-0.5b-shape (random init)" if not small else "qwen2-tiny", "tp": 1, "pp": 1,
           "dtype": str(dtype).replace("torch.", ""), "bucket_mb": args.bucket_mb, "params": params,
           "ratio_definition": "export+consume GB/s / device copy GB/s (bytes counted once); the consumer "
                               "copies each bucket into preallocated HF buffers with one torch._foreach_copy_ per dtype; "
                               "export dtype = the model dtype (megatron's fp32 norm weights are cast)",
           "variants": {"per_tensor_consumer_GBps": "same export, consumer copies tensor by tensor",
                        "general_path_GBps": "WeightExporter(fast_path=False, coalesce=False): per-tensor conversion "
                                             "every sync (the TP>1 / PP>1 path before coalescing), per-tensor consumer",
                        "general_coalesced_GBps": "WeightExporter(fast_path=False) (coalesce=True, the default): the "
                                                  "TP>1 / PP>1 plan at TP=1: one packing copy per bucket, no "
                                                  "collective (a world of one), views or one batched copy; "
                                                  "batched consumer. At TP>1 add one all-gather of the bucket "
                                                  "over TP, at PP>1 one broadcast per owning stage",
                        "general_coalesced_per_tensor_consumer_GBps": "the same, per-tensor consumer"}}
    C.write_result("weight_export", dev, cfg, results, baseline, round(export_bps / copy_bps, 4))
    return 0 if not missing and not wrong else 1


if __name__ == "__main__":
    raise SystemExit(main())
