"""Where the GPU time goes: the rollout's decode step and the actor update, per kernel class.

The numbers behind issue #24's "what stands in the way" (the headline ratios come from rollout.py and
rl_step.py). Two parts, each under ``torch.profiler`` (CUPTI kernel records, read back from the
Chrome trace so that every kernel is counted once, including those a CUDA graph replays):

* ``decode``: the native engine's fast decoder (CUDA graphs; eager-graph and ``torch.compile``d
  variants) on Qwen2-0.5B's shape at batch 64 (prompt 128, 256 new tokens) and batch 512 (prompt
  128, 1024 new tokens; ``--decode-sizes``). Per decode step: wall time, summed kernel time per
  class, kernel count, and the share of the wall the GPU was busy.
* ``update``: ``MegatronTrainer`` steps of the rl_step workload (16 prompts x 4, prompt 128 + 256
  new) with the actor update wrapped in the profiler on the last step; update wall time, model
  FLOPs (6 N T + 12 L h S T) and MFU against the bf16 matmul peak measured in the same run, and
  the kernel classes. Run at the trainer's default micro-batch (16 rows) and at the whole batch in
  one token-budget micro-batch (``trainer.args.use_dynamic_bsz``), side by side.

    python benchmarks/kernel_profile.py        # writes benchmarks/results/kernel_profile-<device>.json

``--small`` (default without a GPU) runs tiny shapes on CPU, where only CPU ops are recorded: it
proves the script runs, not what a GPU does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks import _common as C  # noqa: E402

CLASSES = ("gemm", "attention", "triton (inductor-fused)", "random", "reduction/softmax/norm",
           "elementwise", "copy/index/cat", "other")


def kernel_class(name: str) -> str:
    """A kernel's class from its CUDA symbol name (cuBLAS, CUTLASS, SDPA, inductor, ATen)."""
    n = name.lower()
    if any(s in n for s in ("flash", "fmha", "attention", "attn")):
        return "attention"
    if any(s in n for s in ("gemm", "nvjet", "xmma", "cutlass", "cublas", "splitk", "gemv", "matmul")):
        return "gemm"
    if n.startswith("triton"):
        return "triton (inductor-fused)"
    if any(s in n for s in ("philox", "distribution", "curand", "random")):
        return "random"
    if any(s in n for s in ("softmax", "reduce", "argmax", "norm", "logsumexp", "scan")):
        return "reduction/softmax/norm"
    if any(s in n for s in ("copy", "memcpy", "memset", "index", "scatter", "gather", "cat", "fill")):
        return "copy/index/cat"
    if "elementwise" in n or "vectorized" in n or "unrolled" in n:
        return "elementwise"
    return "other"


def gpu_kernels(prof, workdir: str) -> list[dict]:
    """Every GPU activity (kernel, memcpy, memset) of ``prof``: name, start and duration in microseconds."""
    path = Path(workdir) / f"trace_{time.monotonic_ns()}.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text()).get("traceEvents", [])
    path.unlink()
    return [{"name": e.get("name", ""), "ts": float(e["ts"]), "dur": float(e.get("dur", 0.0))}
            for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]


def summarise(kernels: list[dict], per: float = 1.0, top: int = 12) -> dict:
    """Kernel time by class (microseconds, divided by ``per``), the busy span and the top kernels."""
    by_class: dict[str, float] = defaultdict(float)
    by_name: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for k in kernels:
        by_class[kernel_class(k["name"])] += k["dur"]
        by_name[k["name"]][0] += k["dur"]
        by_name[k["name"]][1] += 1
    busy = sum(k["dur"] for k in kernels)
    span = (max(k["ts"] + k["dur"] for k in kernels) - min(k["ts"] for k in kernels)) if kernels else 0.0
    tops = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "kernel_us": round(busy / per, 1),
        "kernels": round(len(kernels) / per, 1),
        "gpu_span_us": round(span / per, 1),
        "busy_fraction_of_span": round(busy / span, 3) if span else None,
        "by_class_us": {c: round(by_class[c] / per, 1) for c in CLASSES if by_class.get(c)},
        "by_class_share": {c: round(by_class[c] / busy, 3) for c in CLASSES if by_class.get(c)} if busy else {},
        "top_kernels": [{"name": n[:160], "class": kernel_class(n), "us": round(v[0] / per, 1), "count": v[1]}
                        for n, v in tops],
    }


def _profiler():
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    return profile(activities=acts)


# ---------------------------------------------------------------------------------------------- decode
def profile_decode(mc, shape, dev, B: int, P: int, R: int, compile: bool, workdir: str) -> dict:
    from verl_bridge.rollout.fast_decode import FastEngine

    plist, sp = C.random_workload(shape["vocab_size"], B, P, R, seed=B)
    eng = FastEngine(mc, dev, compile=compile)
    eng.generate(plist, sp, seed=0)  # capture (and compile)
    wall = C.timed(lambda: eng.generate(plist, sp, seed=1), dev, repeat=2)
    with _profiler() as prof:
        eng.generate(plist, sp, seed=2)
        C.sync(dev)
    ks = gpu_kernels(prof, workdir)
    steps = R - 1
    out = {"batch": B, "prompt_len": P, "new_tokens": R, "compiled": compile,
           "sampler_fallback": eng.sampler_fallback, "tokens_per_s": B * R / wall,
           "wall_us_per_token_step": round(wall / R * 1e6, 1), "per_decode_step": summarise(ks, per=steps)}
    del eng
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return out


def profile_decodes(sizes, shape, small, dtype, dev, workdir) -> list:
    from verl_bridge.distributed import init_model_parallel, seed_everything

    init_model_parallel(1, 1)
    seed_everything(0)
    hf_dir = tempfile.mkdtemp(prefix="hf_", dir=workdir)
    C.make_hf_model(shape, hf_dir, dtype=dtype)
    mc = C.megatron_model(hf_dir, dtype, dev)
    out = []
    for spec in (sizes or ("4:16:16" if small else "64:128:256:ec,512:128:1024:c")).split(","):
        B, P, R, *mode = spec.split(":")
        B, P, R = int(B), int(P), int(R)
        mode = mode[0] if mode else ("e" if small else "ec")  # e: eager-graph decoder, c: compiled; ec: both
        for comp in [m == "c" for m in mode]:
            try:
                out.append(profile_decode(mc, shape, dev, B, P, R, comp, workdir))
            except Exception as e:  # noqa: BLE001 - record, don't hide
                out.append({"batch": B, "compiled": comp, "error": f"{type(e).__name__}: {e}"[:400]})
            print(json.dumps(out[-1])[:2000], flush=True)
    return out


# ---------------------------------------------------------------------------------------------- update
def _update_child(model_dir: str, small: bool, dynamic: bool, out: str, workdir: str, eager_layers: bool = False) -> None:
    """One trainer (rl_step's workload), 4 steps; the last step's actor update runs under the profiler
    (the first three unprofiled: the first includes torch.compile of the layers)."""
    from benchmarks import rl_step
    import verl_bridge.runtime.trainer as T

    real_update = T.update
    calls = {"n": 0}
    record: dict = {}
    dev = C.device()

    def timed_update(exp, state, spec, step):
        calls["n"] += 1
        C.sync(dev)
        if calls["n"] < 4:
            t0 = time.perf_counter()
            res = real_update(exp, state, spec, step)
            C.sync(dev)
            record.setdefault("update_wall_s_unprofiled", []).append(time.perf_counter() - t0)
            record["tokens"] = int(exp.attention_mask.numel())
            record["real_tokens"] = int(exp.attention_mask.sum())
            record["shape"] = list(exp.attention_mask.shape)
            return res
        with _profiler() as prof:
            res = real_update(exp, state, spec, step)
            C.sync(dev)
        record["profile"] = summarise(gpu_kernels(prof, workdir))
        return res

    T.update = timed_update
    args = {"compile_layers": False} if eager_layers else {}
    if dynamic:
        args.update(use_dynamic_bsz=True, max_tokens_per_micro_batch=1 << 16)
    rl_step.run_ours(model_dir, small, steps=4, compile_decode=False, extra={"trainer": {"args": args}})
    Path(out).write_text(json.dumps(record))


def profile_update(shape, small: bool, dev, workdir: str) -> dict:
    import subprocess

    from benchmarks import rl_step

    w = rl_step._workload(small)
    model_dir = tempfile.mkdtemp(prefix="prof_upd_", dir=workdir)
    C.make_hf_model(shape, model_dir, dtype=torch.float32 if dev.type == "cpu" else torch.bfloat16)
    rl_step._write_prompts(Path(model_dir) / "prompts.jsonl", shape["vocab_size"], 64, w["P"])
    L, h, V, ffn = (shape[k] for k in ("num_hidden_layers", "hidden_size", "vocab_size", "intermediate_size"))
    kv = h // shape["num_attention_heads"] * shape["num_key_value_heads"]
    n_matmul = L * (h * (h + 2 * kv) + h * h + 3 * h * ffn) + V * h
    peak = C.matmul_tflops(dev, 8192) if dev.type == "cuda" else None
    res = {"matmul_peak_tflops": peak, "flops_formula": "6*N*T + 12*L*h*S*T over the real (unpadded) tokens"}
    # the trainer's default (trainer.args.compile_layers auto: compiled on CUDA) in two batchings, and the
    # token-budget batching with eager layers (what the update cost before compile_layers)
    for label, dynamic, eager in (("micro_batch_16_rows", False, False), ("token_budget_one_micro_batch", True, False),
                                  ("token_budget_eager_layers", True, True)):
        out = Path(model_dir) / f"{label}.json"
        cmd = [sys.executable, __file__, "--update-child", label, "--model-dir", model_dir, "--out", str(out),
               "--workdir", workdir] + (["--small"] if small else []) + (["--dynamic"] if dynamic else []) + (["--eager-layers"] if eager else [])
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])})
        if proc.returncode != 0:
            res[label] = {"error": proc.stderr[-1500:]}
            print(proc.stderr[-3000:], file=sys.stderr)
            continue
        rec = json.loads(out.read_text())
        t = min(rec["update_wall_s_unprofiled"])
        S = rec["shape"][1]
        flops = 6 * n_matmul * rec["real_tokens"] + 12 * L * h * S * rec["real_tokens"]
        rec.update(update_wall_s=t, model_tflop=flops / 1e12, tflops=flops / t / 1e12)
        if peak:
            rec["mfu"] = flops / t / 1e12 / peak
        res[label] = rec
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--parts", default="update,decode", help="comma-separated, run in this order")
    ap.add_argument("--decode-sizes", default=None, help="B:P:R[:e|c|ec],... (e: eager-graph decoder, c: compiled; default on CUDA "
                         "64:128:256:ec,512:128:1024:c)")
    ap.add_argument("--update-child", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    ap.add_argument("--dynamic", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--eager-layers", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    dev = C.device()
    small = args.small or dev.type == "cpu"
    if args.update_child:
        _update_child(args.model_dir, small, args.dynamic, args.out, args.workdir, args.eager_layers)
        return 0
    shape = C.QWEN2_TINY if small else C.QWEN2_05B
    dtype = torch.float32 if dev.type == "cpu" else torch.bfloat16
    workdir = tempfile.mkdtemp(prefix="kprof_")
    parts = args.parts.split(",")
    results: dict = {}
    cfg = {"model": "qwen2-0.5b-shape (random init)" if not small else "qwen2-tiny", "dtype": str(dtype),
           "what": "per-kernel-class GPU time of the decode step and the actor update (torch.profiler / CUPTI)"}
    for part in parts:  # the JSON is rewritten after each part, so a run cut short keeps what it measured
        if part == "update":
            results["update"] = profile_update(shape, small, dev, workdir)
            print(json.dumps(results["update"])[:4000], flush=True)
        elif part == "decode":
            results["decode"] = profile_decodes(args.decode_sizes, shape, small, dtype, dev, workdir)
        else:
            raise SystemExit(f"--parts: unknown part {part!r} (allowed: decode, update)")
        C.write_result("kernel_profile", dev, cfg, results, {}, None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
