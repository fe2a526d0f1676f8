"""The portable layer spec: SDPAttention equals explicit softmax attention (causal, GQA, padding)."""

import math

import torch

from tests.dist_utils import run_distributed


def _attention_cases(rank, world_size):
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from verl_bridge.models.spec import SDPAttention
    from verl_bridge.distributed import init_model_parallel

    init_model_parallel(1, 1)
    cfg = TransformerConfig(num_layers=1, hidden_size=32, num_attention_heads=4, num_query_groups=2,
                            use_cpu_initialization=True)
    attn = SDPAttention(cfg, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self").eval()
    torch.manual_seed(0)
    s, b, d = 5, 2, 8
    q = torch.randn(s, b, 4, d)
    k = torch.randn(s, b, 2, d)
    v = torch.randn(s, b, 2, d)

    def reference(mask):  # mask True = masked out, [b, 1, s, s]
        kk, vv = k.repeat_interleave(2, dim=2), v.repeat_interleave(2, dim=2)
        scores = torch.einsum("sbhd,tbhd->bhst", q, kk) / math.sqrt(d)
        scores = scores.masked_fill(mask, float("-inf"))
        return torch.einsum("bhst,tbhd->sbhd", scores.softmax(-1), vv).reshape(s, b, 4 * d)

    causal = torch.ones(s, s, dtype=torch.bool).triu(1)[None, None].expand(b, 1, s, s)
    out_causal = attn(q, k, v, None)
    pad = causal.clone()
    pad[0, :, :, :2] = True          # row 0 has two left-pad keys
    pad[0, :, :2, :2] = ~torch.eye(2, dtype=torch.bool)  # pads attend to themselves
    out_pad = attn(q, k, v, pad)
    return (out_causal - reference(causal)).abs().max().item(), (out_pad - reference(pad)).abs().max().item()


def test_sdpa_attention_matches_explicit_softmax():
    causal_err, pad_err = run_distributed(_attention_cases, 1)[0]
    assert causal_err < 1e-5
    assert pad_err < 1e-5


def _gpt_forward_backward(rank, world_size):
    from verl_bridge.config.schema import ModelArgs
    from verl_bridge.models.tiny import tiny_model_provider
    from verl_bridge.distributed import init_model_parallel, seed_everything

    init_model_parallel(world_size, 1)
    seed_everything(0)
    model = tiny_model_provider(ModelArgs(), 16, 32, tp_size=world_size)(True, True)
    ids = torch.randint(0, 16, (2, 10), generator=torch.Generator().manual_seed(1))
    logits = model(ids, torch.arange(10).unsqueeze(0).expand(2, -1), None)
    logits.float().pow(2).mean().backward()
    grads = [p.grad is not None and bool(torch.isfinite(p.grad).all()) for p in model.parameters()]
    return tuple(logits.shape), all(grads)


def test_gpt_model_trains_on_cpu_at_tp1_and_tp2():
    shape1, ok1 = run_distributed(_gpt_forward_backward, 1)[0]
    res2 = run_distributed(_gpt_forward_backward, 2)
    assert shape1 == (2, 10, 16) and ok1
    assert all(ok for _, ok in res2)
    assert res2[0][0] == (2, 10, 8)  # vocab-parallel logits: 16 / TP 2
