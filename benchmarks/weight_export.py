"""Weight-sync bandwidth: the bucketed megatron -> HF-named export vs a plain device copy, one run.

Model: Qwen2-0.5B's shape, random weights, bf16 on CUDA, TP=1 (one GPU). The export streams every
HF-named tensor (QKV split by query groups, gate/up split, tied embeddings handled) in buckets of
``--bucket-mb`` and the consumer copies each into a preallocated HF-layout buffer, as a rollout
engine's ``load_weights`` does. ``export_GBps`` = HF bytes delivered / wall time of export +
consumer copies. ``copy_GBps`` = bytes / time of one device ``copy_`` of the same number of bytes
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

    from verl_bridge.arch import hf_model_provider
    from verl_bridge.parallel import init_model_parallel, seed_everything
    from verl_bridge.resharding.export import WeightExporter

    init_model_parallel(1, 1)
    seed_everything(0)  # also megatron's CUDA RNG tracker, which GPU initialisation needs
    tmp = tempfile.mkdtemp(prefix="bench_export_")
    hf = C.make_hf_model(shape, tmp, dtype=dtype)
    expected = {k: v.to(dev) for k, v in hf.state_dict().items()}
    del hf
    from verl_bridge.models.tiny import precision_kwargs

    over = dict(precision_kwargs("bf16"), use_cpu_initialization=False) if dtype == torch.bfloat16 else {}
    mc = hf_model_provider(tmp, **over)(True, True).to(dev).eval()
    bucket = args.bucket_mb << 20
    ex = WeightExporter(mc, bucket_bytes=bucket, vocab_size=shape["vocab_size"])
    dst = {n: torch.empty_like(t) for n, t in expected.items() if n != "lm_head.weight" or not shape["tie_word_embeddings"]}

    def sync_once():
        n = 0
        for b in ex.iter_buckets():
            for name, t in b:
                dst[name].copy_(t)
                n += t.numel() * t.element_size()
        return n

    total = sync_once()  # warm-up, and the correctness check below
    missing = sorted(set(dst) - set(ex.hf_names()))
    wrong = [n for n in dst if n in expected and not torch.equal(dst[n], expected[n])]
    t = C.timed(sync_once, dev, repeat=5)
    export_bps = total / t
    copy_bps = C.copy_bandwidth(dev, total)
    params = sum(p.numel() for p in mc.parameters())
    results = {"export_GBps": export_bps / 1e9, "seconds_per_sync": t, "bytes_per_sync": total,
               "seconds_per_billion_params": t / (params / 1e9), "buckets": ex.stats.buckets,
               "peak_extra_bytes": ex.stats.peak_extra_bytes, "bucket_bytes": bucket,
               "exporter_only_GBps": ex.stats.gbps, "tensors": ex.stats.tensors,
               "check_missing_names": missing, "check_mismatched_tensors": wrong[:10]}
    baseline = {"copy_GBps": copy_bps / 1e9}
    cfg = {"model": "qwen2-0.5b-shape (random init)" if not small else "qwen2-tiny", "tp": 1, "pp": 1,
           "dtype": str(dtype).replace("torch.", ""), "bucket_mb": args.bucket_mb, "params": params,
           "ratio_definition": "export+consume GB/s / device copy GB/s (bytes counted once)"}
    C.write_result("weight_export", dev, cfg, results, baseline, round(export_bps / copy_bps, 4))
    return 0 if not missing and not wrong else 1


if __name__ == "__main__":
    raise SystemExit(main())
