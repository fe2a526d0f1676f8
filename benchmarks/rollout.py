"""Rollout throughput: verl-bridge's native engine vs Hugging Face ``generate``, same model, one run.

Model: Qwen2-0.5B's shape with random weights (bf16 on CUDA), the same weights in both: the HF
model is built first and the megatron-core GPTModel is imported from it
(:func:`verl_bridge.arch.hf_model_provider`). Workload: batch 64, prompt 128 tokens, 256 new
tokens, sampling at temperature 1 (no top-k/top-p), EOS disabled so every row makes 256 tokens.

Measured side by side: the native engine (on CUDA: the CUDA-graph fast decoder reading the
megatron parameters in place), HF ``generate`` with its default dynamic cache, and HF ``generate``
with ``cache_implementation="static"`` (which compiles the decode step). ``ratio`` = native
tokens/s / the faster HF mode. A correctness check compares the fast decoder's prefill logits with
the megatron module forward on the same batch. ``--small`` (default on CPU) shrinks everything.

    python benchmarks/rollout.py            # writes benchmarks/results/rollout-<device>.json
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
    ap.add_argument("--small", action="store_true", help="tiny shapes (default when there is no GPU)")
    ap.add_argument("--skip-static", action="store_true", help="skip HF static-cache generate (it compiles)")
    ap.add_argument("--no-compile", action="store_true", help="skip the compiled variant of the fast decoder")
    args = ap.parse_args(argv)
    dev = C.device()
    small = args.small or dev.type == "cpu"
    shape = C.QWEN2_TINY if small else C.QWEN2_05B
    B, P, R = (4, 16, 16) if small else (64, 128, 256)
    dtype = torch.float32 if dev.type == "cpu" else torch.bfloat16

    from verl_bridge.distributed import init_model_parallel, seed_everything
    from verl_bridge.rollout.base import SamplingParams
    from verl_bridge.rollout.native import NativeEngine

    init_model_parallel(1, 1)
    seed_everything(0)  # also megatron's CUDA RNG tracker, which GPU initialisation needs
    tmp = tempfile.mkdtemp(prefix="bench_rollout_")
    hf = C.make_hf_model(shape, tmp, dtype=dtype).to(dev).eval()
    mc = C.megatron_model(tmp, dtype, dev)

    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, shape["vocab_size"], (B, P), generator=g)
    sp = SamplingParams(max_new_tokens=R, temperature=1.0, top_p=1.0, top_k=0, eos_token_id=None, pad_token_id=0)
    results, baseline = {}, {}

    # correctness: fast decoder prefill logits vs the megatron module forward (same weights, same batch)
    engine = NativeEngine(mc, dev)
    results["engine_path"] = "fast (CUDA graphs)" if engine.fast is not None else f"module ({engine.fast_reason or 'CPU'})"
    from verl_bridge.rollout.fast_decode import FastDecoder, _State
    from verl_bridge.runtime.batch import model_inputs

    with torch.no_grad():
        ids = prompts[:8].to(dev)
        mask = torch.ones_like(ids)
        _, pos, m = model_inputs(ids, mask)
        ref = mc(ids, pos, m).float()
        dec = FastDecoder(mc)
        st = _State(dec, ids.shape[0], P, 1, dev, dtype)
        attend = torch.ones(P, P, dtype=torch.bool, device=dev).tril()[None].expand(ids.shape[0], P, P)
        got = dec.forward_prefill(ids, attend, pos, st.cache_k, st.cache_v)
        hf_logits = hf(ids).logits.float()
    results["check_fast_vs_megatron_max_abs_logit_diff"] = float((got - ref).abs().max())
    results["check_megatron_vs_hf_max_abs_logit_diff"] = float((ref[..., : shape["vocab_size"]] - hf_logits).abs().max())
    results["check_logit_scale_max_abs"] = float(ref.abs().max())

    plist = prompts.tolist()
    engine.generate(plist, sp, seed=0)  # warm-up: graph capture
    t = C.timed(lambda: engine.generate(plist, sp, seed=1), dev, repeat=3)
    out = engine.generate(plist, sp, seed=2)
    assert out.response_mask.sum().item() == B * R, "EOS is disabled: every row must produce R tokens"
    results["native_eager_graph_tokens_per_s"] = B * R / t
    best_native = B * R / t
    if engine.fast is not None and not args.no_compile:
        # the same decoder with its step compiled by inductor before graph capture
        from verl_bridge.rollout.fast_decode import FastEngine

        try:
            comp = FastEngine(mc, dev, compile=True)
            comp.generate(plist, sp, seed=0)  # compile + capture
            tc = C.timed(lambda: comp.generate(plist, sp, seed=1), dev, repeat=3)
            results["native_compiled_graph_tokens_per_s"] = B * R / tc
            best_native = max(best_native, B * R / tc)
            del comp
        except Exception as e:  # noqa: BLE001 - record, don't hide
            results["native_compiled_error"] = f"{type(e).__name__}: {e}"[:300]
    results["native_tokens_per_s"] = best_native

    ids = prompts.to(dev)
    am = torch.ones_like(ids)
    gen_kw = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=R, min_new_tokens=R,
                  pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        hf.generate(ids, attention_mask=am, **gen_kw)
        t = C.timed(lambda: hf.generate(ids, attention_mask=am, **gen_kw), dev, repeat=2)
    baseline["hf_dynamic_tokens_per_s"] = B * R / t
    if not args.skip_static:
        try:
            with torch.no_grad():
                for _ in range(2):  # compile + warm-up
                    hf.generate(ids, attention_mask=am, cache_implementation="static", **gen_kw)
                t = C.timed(lambda: hf.generate(ids, attention_mask=am, cache_implementation="static", **gen_kw),
                            dev, repeat=2)
            baseline["hf_static_tokens_per_s"] = B * R / t
        except Exception as e:  # noqa: BLE001 - record, don't hide
            baseline["hf_static_error"] = f"{type(e).__name__}: {e}"[:300]
    best = max(v for k, v in baseline.items() if k.endswith("tokens_per_s"))
    ratio = round(results["native_tokens_per_s"] / best, 3)
    cfg = {"model": "qwen2-0.5b-shape (random init)" if not small else "qwen2-tiny", "batch": B,
           "prompt_len": P, "new_tokens": R, "dtype": str(dtype).replace("torch.", ""),
           "sampling": "temperature 1.0, no top-k/top-p",
           "ratio_definition": "native (faster of eager-graph / compiled-graph decoder) / faster HF generate mode"}
    C.write_result("rollout", dev, cfg, results, baseline, ratio)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
