"""The fast decoder's Triton GQA decode-attention kernel equals ``scaled_dot_product_attention`` with
the boolean key mask (one query token per row, r heads per K/V group), with and without split-K, on
cache views with the decoder's strides; and the fast decoder through it equals the fast decoder on SDPA. Runs the real kernel source under Triton's interpreter
(``TRITON_INTERPRET=1``, CPU); needs the ``triton`` package, which CUDA builds of torch ship (the
megatron-core 0.19.2 tier of CI) and the CPU wheel does not."""

import os
import subprocess
import sys
import textwrap

import pytest

triton = pytest.importorskip("triton", reason="triton comes with CUDA builds of torch (CI's mcore 0.19.2 tier)")

PROBE = textwrap.dedent("""
    import torch, torch.nn.functional as F
    from verl_bridge.rollout.decode_attention import gqa_decode_attention, triton_reason
    assert triton_reason(torch.device("cpu"), 64, 7) is None          # interpreter: CPU allowed
    assert "power of two" in triton_reason(torch.device("cpu"), 48, 7)
    g = torch.Generator().manual_seed(0)
    worst = 0.0
    for B, G, r, hd, Lfull, L, splits in ((3, 2, 7, 32, 160, 150, 1), (2, 2, 4, 16, 200, 200, 3), (1, 1, 1, 16, 70, 65, 2)):
        qkv = torch.randn(B, G, r + 2, hd, generator=g)               # the decoder's fused view
        q = qkv[:, :, :r]
        ck = torch.randn(B, G, Lfull, hd, generator=g)[:, :, :L]      # a bucketed cache slice
        cv = torch.randn(B, G, Lfull, hd, generator=g)[:, :, :L]
        valid_full = torch.rand(B, Lfull, generator=g) > 0.3
        valid_full[:, L - 1] = True                                    # the slot just written
        valid_full[0, : L // 2] = False                                # a long left padding
        valid = valid_full[:, :L]
        out = gqa_decode_attention(q, ck, cv, valid, 0.125, block_n=16, splits=splits)
        ref = F.scaled_dot_product_attention(q, ck, cv, attn_mask=valid[:, None, None, :], scale=0.125)
        assert out.shape == ref.shape and out.dtype == q.dtype
        worst = max(worst, (out - ref).abs().max().item())
        # the decoder's call: whole cache buffers and the attended length (no sliced views)
        whole = gqa_decode_attention(q, ck.as_strided((B, G, Lfull, hd), ck.stride()), cv.as_strided((B, G, Lfull, hd), cv.stride()),
                                     valid_full, 0.125, block_n=16, splits=splits, length=L)
        worst = max(worst, (whole - ref).abs().max().item())
    print("WORST", worst)
""")

DECODER = textwrap.dedent("""
    import torch
    from verl_bridge.config.schema import ModelArgs
    from verl_bridge.distributed import init_model_parallel, seed_everything
    from verl_bridge.models.tiny import tiny_model_provider
    from verl_bridge.rollout.base import SamplingParams
    from verl_bridge.rollout.fast_decode import FastDecoder, FastEngine

    init_model_parallel(1, 1)
    seed_everything(0)
    model = tiny_model_provider(ModelArgs(num_query_groups=2), 16, 64)(True, True).eval()  # GQA, head_dim 16
    assert FastDecoder(model).attention == "triton"                  # auto picks the kernel where it runs
    import verl_bridge.rollout.decode_attention as da
    real = da.gqa_decode_attention
    da._CHECKED.clear()
    da.gqa_decode_attention = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("PassManager::run failed"))
    dec = FastDecoder(model)                                         # a kernel that cannot build: SDPA, with why
    assert dec.attention == "sdpa" and "PassManager::run failed" in dec.attention_reason, dec.attention_reason
    da.gqa_decode_attention, da._CHECKED = real, {}
    assert FastDecoder(model).attention == "triton"
    ids = torch.randint(2, 16, (3, 12), generator=torch.Generator().manual_seed(1))
    a = FastDecoder(model, attention="triton").teacher_forced_logits(ids, 6)
    b = FastDecoder(model, attention="sdpa").teacher_forced_logits(ids, 6)
    print("LOGITS", (a - b).abs().max().item())
    sp = SamplingParams(max_new_tokens=8, temperature=0.0, top_p=1.0, top_k=0, eos_token_id=None, pad_token_id=0)
    prompts = [[3, 4, 5], [6, 7, 8, 9, 10, 11, 2], [5]]
    outs = [FastEngine(model, torch.device("cpu"), attention=att).generate(prompts, sp, seed=0) for att in ("triton", "sdpa")]
    assert torch.equal(outs[0].response_ids, outs[1].response_ids)
    print("GREEDY", outs[0].response_ids.tolist())
""")


def test_triton_decode_attention_equals_sdpa_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    worst = float(proc.stdout.split("WORST")[1])
    assert worst < 1e-5, worst


def test_fast_decoder_with_the_kernel_equals_sdpa_decoder():
    """The decoder's decode steps through the kernel (teacher-forced logits, greedy generation with
    left-padded prompts of different lengths) equal the SDPA path's."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env.pop("VERL_BRIDGE_DECODE_ATTENTION", None)
    proc = subprocess.run([sys.executable, "-c", DECODER], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert float(proc.stdout.split("LOGITS")[1].split()[0]) < 1e-4
    assert "GREEDY" in proc.stdout
