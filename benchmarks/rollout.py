"""Rollout throughput: verl-bridge's native engine vs Hugging Face ``generate``, same model, one run.

Model: Qwen2-0.5B's shape with random weights (bf16 on CUDA), the same weights in both: the HF
model is built first and the megatron-core GPTModel is imported from it
(:func:`verl_bridge.arch.hf_model_provider`). Workload: batch 64, prompt 128 tokens, 256 new
tokens, sampling at temperature 1 (no top-k/top-p), EOS disabled so every row makes 256 tokens.

Measured side by side: the native engine (on CUDA: the CUDA-graph fast decoder reading the
megatron parameters in place), HF ``generate`` with its default dynamic cache, and HF ``generate``
with ``cache_implementation="static"`` (which compiles the decode step). ``ratio`` = native
tokens/s / the faster HF mode. Then ``rl_sizes``: the same engine at RL batch sizes (256 and 512
rows, 1024 new tokens; ``--rl-sizes``) with HF static beside it and the fraction of the bandwidth
roofline (:func:`roofline`: weights read once per step plus the KV slots each row attends, against
the GPU's data-sheet HBM bandwidth (``_common.SPEC_BANDWIDTH``: H200 4.8 TB/s, H100 SXM 3.35 TB/s) and
against twice the measured copy rate). A correctness check compares the fast decoder's prefill logits with
the megatron module forward on the same batch. ``--early-eos B:R:MEAN`` adds rows that end at many
lengths (:func:`early_eos`): compaction of finished rows on and off, and the compiled decoder.
``--small`` (default on CPU) shrinks everything.

    python benchmarks/rollout.py            # writes benchmarks/results/rollout-<device>.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import _common as C  # noqa: E402


def roofline(shape: dict, B: int, P: int, R: int, dtype: torch.dtype, bytes_per_s: float) -> dict:
    """Tokens/s if every decode step only read the weights once and the KV cache it attends over.

    Per decode step (one token for each of ``B`` rows): all parameters are read once (the tied
    embedding as the LM head included), and each row reads its keys and values for the ``c`` slots it
    attends (``c`` = prompt + tokens so far) and writes one slot. Summed over the ``R - 1`` decode
    steps; the prefill (compute-bound, one pass) is left out, which makes the limit higher, not lower.
    """
    h, L, V, I = shape["hidden_size"], shape["num_hidden_layers"], shape["vocab_size"], shape["intermediate_size"]
    heads, kv = shape["num_attention_heads"], shape["num_key_value_heads"]
    hd = h // heads
    per_layer = h * (heads * hd + 2 * kv * hd) + heads * hd * h + 3 * h * I + 2 * h + (heads + 2 * kv) * hd
    params = L * per_layer + V * h + h
    isz = torch.tensor([], dtype=dtype).element_size()
    w_bytes = params * isz
    kv_slot = 2 * L * kv * hd * isz  # K and V of one position, all layers
    total = 0
    for step in range(1, R):
        c = P + step  # slots attended at this step (the prompt, earlier tokens and its own)
        total += w_bytes + B * (c * kv_slot + kv_slot)
    tokens = B * (R - 1)
    return {"bytes_per_s_assumed": bytes_per_s, "weight_bytes": w_bytes, "kv_bytes_per_slot": kv_slot,
            "decode_bytes_total": total, "tokens_per_s_limit": tokens / (total / bytes_per_s)}


def engine_seconds(engine, plist, sp, dev, repeat: int) -> float:
    """One generation of ``plist`` to warm ``engine`` up (graph capture, compilation), then the best of
    ``repeat`` timed ones (other seeds)."""
    engine.generate(plist, sp, seed=0)
    return C.timed(lambda: engine.generate(plist, sp, seed=1), dev, repeat=repeat)


def rl_size(mc, hf, shape, dev, dtype, B: int, P: int, R: int, compile: bool, sdpa_too: bool = False) -> dict:
    """Native tokens/s at an RL batch (``B`` rows, ``R`` new tokens) against the bandwidth roofline;
    ``sdpa_too``: also the same engine with SDPA as its decode attention instead of the Triton kernel."""
    from verl_bridge.rollout.native import NativeEngine

    plist, sp = C.random_workload(shape["vocab_size"], B, P, R, seed=B)
    engine = NativeEngine(mc, dev, compile=compile)
    t = engine_seconds(engine, plist, sp, dev, repeat=2)  # after capture (and compilation)
    out = {"batch": B, "prompt_len": P, "new_tokens": R, "native_tokens_per_s": B * R / t,
           "compiled": compile,
           "engine_path": "fast" if engine.fast is not None else "module",
           "decode_attention": engine.fast.decoder.attention if engine.fast is not None else None}
    if sdpa_too and engine.fast is not None and engine.fast.decoder.attention != "sdpa":
        del engine
        other = NativeEngine(mc, dev, compile=compile, attention="sdpa")
        out["native_tokens_per_s_sdpa_attention"] = B * R / engine_seconds(other, plist, sp, dev, repeat=2)
        engine = other
    if dev.type == "cuda":
        spec = C.spec_bandwidth(dev)  # the data sheet's HBM bandwidth (H200 4.8 TB/s, H100 SXM 3.35 TB/s)
        copy = C.copy_bandwidth(dev, 1 << 30)
        lines = [("measured_copy_traffic", 2 * copy)]
        if spec is not None:
            lines.insert(0, (f"spec_{spec / 1e12:g}TBps", spec))
        for label, bw in lines:
            lim = roofline(shape, B, P, R, dtype, bw)
            out[f"roofline_{label}"] = lim
            out[f"fraction_of_roofline_{label}"] = out["native_tokens_per_s"] / lim["tokens_per_s_limit"]
    del engine
    if hf is not None:  # the faster HF mode at the same size (static cache, compiled), one timed run
        ids = torch.tensor(plist, device=dev)
        am = torch.ones_like(ids)
        kw = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=R, min_new_tokens=R,
                  pad_token_id=0, eos_token_id=None, cache_implementation="static")
        try:
            with torch.no_grad():
                hf.generate(ids, attention_mask=am, **kw)
                th = C.timed(lambda: hf.generate(ids, attention_mask=am, **kw), dev, repeat=1)
            out["hf_static_tokens_per_s"] = B * R / th
            out["ratio_vs_hf_static"] = out["native_tokens_per_s"] / out["hf_static_tokens_per_s"]
        except Exception as e:  # noqa: BLE001 - record, don't hide
            out["hf_static_error"] = f"{type(e).__name__}: {e}"[:300]
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return out


def eos_scale(mc, dev, vocab: int, eos: int, proxy: int, mean_len: float, P: int) -> dict:
    """The factor ``a`` for which an EOS logit of ``a * z[proxy]`` ends rows after ~``mean_len`` tokens.

    Random weights never sample a given token (1 in ~152k per step), so the early-EOS section gives
    the EOS row of the LM head ``a`` times the ``proxy`` token's row: the EOS logit becomes
    ``a * z_proxy`` and a step's P(EOS) = sigmoid(a * z_proxy - logsumexp(z without EOS)). ``a`` is
    bisected so that this, averaged over the prefill logits of 8 random prompts (standing in for the
    decode steps' states), is 1 / ``mean_len``: a geometric length law with that mean, as a
    rough picture of an RL batch whose rows end at many lengths. The lengths the run really got
    are reported beside it.
    """
    from verl_bridge.common.batch import model_inputs

    g = torch.Generator().manual_seed(123)
    ids = torch.randint(3, vocab, (8, P), generator=g).to(dev)
    with torch.no_grad():
        _, pos, m = model_inputs(ids, torch.ones_like(ids))
        z = mc(ids, pos, m).float()[..., :vocab].reshape(-1, vocab)
    zk = z[:, proxy].clone()
    z[:, eos] = float("-inf")
    lse = torch.logsumexp(z, dim=-1)
    del z
    target = 1.0 / mean_len

    def p(a: float) -> float:
        return float(torch.sigmoid(a * zk - lse).mean())

    lo, hi = 1.0, 2.0
    while p(hi) < target and hi < 1e6:
        lo, hi = hi, hi * 2
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if p(mid) < target else (lo, mid)
    return {"scale": hi, "per_step_eos_probability_estimate": p(hi)}


def early_eos(mc, shape, dev, B: int, R: int, mean_len: float, P: int = 128, repeat: int = 2) -> dict:
    """Rows that end at many lengths: the fast decoder with compaction of finished rows (the default
    without compile) against the same decoder without it and against the compiled decoder (which
    does not compact), in one run on the same prompts. Tokens/s counts the tokens the rows really
    made (the response mask), over ``repeat`` timed calls per engine, after one warm-up call."""
    from verl_bridge.rollout.base import SamplingParams
    from verl_bridge.rollout.fast_decode import FastDecoder, FastEngine

    eos, proxy = 1, 2  # random prompts draw from 3.. (random_workload): neither appears in a prompt
    cal = eos_scale(mc, dev, shape["vocab_size"], eos, proxy, mean_len, P)
    w = FastDecoder(mc)._output_weight()
    saved = w[eos].clone()
    plist, _ = C.random_workload(shape["vocab_size"], B, P, R, seed=B + 7)
    sp = SamplingParams(max_new_tokens=R, temperature=1.0, top_p=1.0, top_k=0, eos_token_id=eos, pad_token_id=0)
    out = {"batch": B, "prompt_len": P, "new_tokens": R, "target_mean_len": mean_len,
           "eos_calibration": cal, "engines": {}}
    variants = [("compacting", dict(compile=False)), ("not_compacting", dict(compile=False))]
    if dev.type == "cuda":
        variants.append(("compiled", dict(compile=True)))
    try:
        with torch.no_grad():
            w[eos] = (cal["scale"] * w[proxy].float()).to(w.dtype)
        for label, kw in variants:
            engine = FastEngine(mc, dev, **kw)
            if label == "not_compacting":
                engine.compact = False
            engine.generate(plist, sp, seed=0)  # capture (and compile)
            tokens, secs, stats = 0, 0.0, {}
            for k in range(repeat):
                C.sync(dev)
                t0 = time.perf_counter()
                res = engine.generate(plist, sp, seed=1 + k)
                C.sync(dev)
                secs += time.perf_counter() - t0
                tokens += int(res.response_mask.sum())
                stats = dict(engine.last_stats)
            lengths = res.response_mask.sum(dim=1).float()
            out["engines"][label] = {
                "tokens_per_s": tokens / secs, "tokens": tokens, "seconds": secs,
                "mean_response_len": float(lengths.mean()), "rows_at_max_len": int((lengths >= R).sum()),
                "row_steps": stats.get("row_steps"), "row_steps_uncompacted": stats.get("row_steps_uncompacted"),
                "final_batch": stats.get("final_batch")}
            del engine
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    finally:
        with torch.no_grad():
            w[eos] = saved
    e = out["engines"]
    out["compaction_speedup"] = e["compacting"]["tokens_per_s"] / e["not_compacting"]["tokens_per_s"]
    if "compiled" in e:
        out["compacting_vs_compiled"] = e["compacting"]["tokens_per_s"] / e["compiled"]["tokens_per_s"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="tiny shapes (default when there is no GPU)")
    ap.add_argument("--skip-static", action="store_true", help="skip HF static-cache generate (it compiles)")
    ap.add_argument("--no-compile", action="store_true", help="skip the compiled variant of the fast decoder")
    ap.add_argument("--skip-rl-static", action="store_true",
                    help="skip HF static-cache generate at the RL sizes only (~2 min at 512 x 1024 on an H100)")
    ap.add_argument("--rl-sizes", default=None,
                    help="comma-separated batch sizes measured at RL sizes (1024 new tokens on CUDA; "
                         "default on CUDA: 256,512; on CPU: 8 with 32 new tokens; none: skip)")
    ap.add_argument("--early-eos", default=None, metavar="B:R:MEAN",
                    help="also measure rows that end early: B rows, R new tokens at most, lengths ~geometric "
                         "with mean MEAN (EOS raised in a random model, see eos_scale); compaction of "
                         "finished rows on / off and the compiled decoder, in one run. E.g. 256:1024:256 "
                         "on CUDA, 8:32:8 on CPU; default: not run")
    args = ap.parse_args(argv)
    early = None
    if args.early_eos:
        try:
            eb, er, em = args.early_eos.split(":")
            early = (int(eb), int(er), float(em))
        except ValueError:
            ap.error(f"--early-eos takes B:R:MEAN (e.g. 256:1024:256), got {args.early_eos!r}")
        if early[0] < 1 or early[1] < 2 or not 1 <= early[2]:
            ap.error(f"--early-eos B:R:MEAN needs B >= 1, R >= 2 and MEAN >= 1, got {args.early_eos!r}")
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
    from verl_bridge.common.batch import model_inputs

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
    t = engine_seconds(engine, plist, sp, dev, repeat=3)  # after graph capture
    out = engine.generate(plist, sp, seed=2)
    assert out.response_mask.sum().item() == B * R, "EOS is disabled: every row must produce R tokens"
    results["native_eager_graph_tokens_per_s"] = B * R / t
    best_native = B * R / t
    if engine.fast is not None and not args.no_compile:
        # the same decoder with its step compiled by inductor before graph capture
        from verl_bridge.rollout.fast_decode import FastEngine

        try:
            comp = FastEngine(mc, dev, compile=True)
            results["decode_attention"] = comp.decoder.attention
            tc = engine_seconds(comp, plist, sp, dev, repeat=3)  # after compilation + capture
            results["native_compiled_graph_tokens_per_s"] = B * R / tc
            best_native = max(best_native, B * R / tc)
            del comp
            if results["decode_attention"] != "sdpa":  # the same, with SDPA as the decode attention
                comp = FastEngine(mc, dev, compile=True, attention="sdpa")
                results["native_compiled_graph_sdpa_attention_tokens_per_s"] = B * R / engine_seconds(
                    comp, plist, sp, dev, repeat=3)
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
    del engine
    sizes = [] if args.rl_sizes == "none" else [
        int(x) for x in (args.rl_sizes or ("8" if small else "256,512")).split(",") if x]
    results["rl_sizes"] = [rl_size(mc, None if args.skip_static or args.skip_rl_static else hf, shape, dev, dtype, b, P,
                                   32 if small else 1024, compile=not small, sdpa_too=b == max(sizes))
                           for b in sizes]
    if early is not None:
        results["early_eos"] = early_eos(mc, shape, dev, *early, P=P)
    cfg = {"model": "qwen2-0.5b-shape (random init)" if not small else "qwen2-tiny", "batch": B,
           "prompt_len": P, "new_tokens": R, "dtype": str(dtype).replace("torch.", ""),
           "sampling": "temperature 1.0, no top-k/top-p",
           "ratio_definition": "native (faster of eager-graph / compiled-graph decoder) / faster HF generate mode"}
    C.write_result("rollout", dev, cfg, results, baseline, ratio)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
