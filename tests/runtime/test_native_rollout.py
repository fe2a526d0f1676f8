"""Native engine: the KV-cache path equals a no-cache forward, and sampling knobs behave."""

import torch

from tests.dist_utils import run_distributed


def _build():
    from verl_bridge.config.schema import ModelArgs
    from verl_bridge.models.tiny import tiny_model_provider
    from verl_bridge.distributed import init_model_parallel, seed_everything

    init_model_parallel(1, 1)
    seed_everything(0)
    return tiny_model_provider(ModelArgs(num_query_groups=2), 16, 64)(True, True)


def _greedy_matches_no_cache(rank, world_size):
    from verl_bridge.rewards import ToyTokenizer
    from verl_bridge.rollout.base import SamplingParams
    from verl_bridge.rollout.native import NativeEngine

    tok = ToyTokenizer()
    model = _build()
    prompts = [tok.encode("<bos>3="), tok.encode("<bos>12+3="), tok.encode("<bos>987=")]
    sp = SamplingParams(max_new_tokens=6, temperature=0.0, eos_token_id=None, pad_token_id=tok.pad_token_id)
    batch = NativeEngine(model, torch.device("cpu")).generate(prompts, sp, seed=0)
    out = []
    with torch.no_grad():
        for i, p in enumerate(prompts):  # reference: full forward without cache or padding
            x = torch.tensor([p])
            for _ in range(6):
                logits = model(x, torch.arange(x.shape[1]).unsqueeze(0), None)
                x = torch.cat([x, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
            out.append((x[0, len(p):].tolist(), batch.response_ids[i].tolist()))
    return out, batch.prompt_mask.tolist()


def test_kv_cache_greedy_equals_full_forward_with_left_padding():
    pairs, prompt_mask = run_distributed(_greedy_matches_no_cache, 1)[0]
    assert prompt_mask[0][:3] == [0, 0, 0]  # the short prompt really was left-padded
    for ref, got in pairs:
        assert ref == got


def _eos_and_seed(rank, world_size):
    from verl_bridge.rollout.base import SamplingParams
    from verl_bridge.rollout.native import NativeEngine

    model = _build()
    eng = NativeEngine(model, torch.device("cpu"))
    prompts = [[13, 3, 11]] * 32
    sp = SamplingParams(max_new_tokens=8, temperature=1.0, eos_token_id=5, pad_token_id=12)
    a = eng.generate(prompts, sp, seed=1)
    b = eng.generate(prompts, sp, seed=1)
    c = eng.generate(prompts, sp, seed=2)
    topk = eng.generate(prompts, SamplingParams(max_new_tokens=8, temperature=1.0, top_k=1, pad_token_id=12), seed=3)
    greedy = eng.generate(prompts, SamplingParams(max_new_tokens=8, temperature=0.0, pad_token_id=12), seed=3)
    return a, b, c, topk, greedy


def test_seeded_sampling_eos_and_top_k():
    a, b, c, topk, greedy = run_distributed(_eos_and_seed, 1)[0]
    assert torch.equal(a.response_ids, b.response_ids)          # same seed, same samples
    assert not torch.equal(a.response_ids, c.response_ids)      # another seed, other samples
    for row, m in zip(a.response_ids, a.response_mask):
        n = int(m.sum())
        hits = (row[:n] == 5).nonzero()
        if len(hits):                                           # generation stops right after EOS
            assert n == int(hits[0]) + 1
            assert (row[n:] == 12).all()
    assert torch.equal(topk.response_ids, greedy.response_ids)  # top_k=1 is greedy


def test_top_p_keeps_the_smallest_prefix():
    from verl_bridge.rollout.sampling import sample_next

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    g = torch.Generator().manual_seed(0)
    seen = {int(sample_next(logits, 1.0, 0.7, 0, generator=g)) for _ in range(300)}
    assert seen == {0, 1}  # 0.5 + 0.3 >= 0.7: tokens 2 and 3 are never drawn
