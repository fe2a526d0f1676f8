"""TP=1 log-probs straight from the model's logits (no fp32 copies) equal the reference path.

The reference is what the update used before (and still uses for the entropy and at TP>1):
``response_logits`` (the response slice, cast to fp32, divided by T, megatron's vocabulary
padding masked) then ``log_softmax(...).gather``. The fused path must give the same values and the
same gradient with respect to the model output, for strided response slices, a temperature,
a padded vocabulary and several chunks.
"""

import pytest
import torch

from verl_bridge.common.batch import response_slice
from verl_bridge.runtime.logprobs import fused_token_log_probs, mask_padded_vocab


def _reference(out, targets, P, R, T, vocab):
    z = response_slice(out, P, R).float()
    z = z / T if T and T != 1.0 else z
    z = mask_padded_vocab(z, vocab, tp_rank=0)
    return torch.log_softmax(z, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("T,vocab", [(1.0, None), (0.7, 45), (0.0, 50)])
def test_fused_matches_reference_values_and_grads(dtype, tol, T, vocab):
    torch.manual_seed(0)
    B, S, P, V = 5, 11, 4, 50
    R = S - P + 1
    base = (3 * torch.randn(B, S, V)).to(dtype)
    targets = torch.randint(0, vocab or V, (B, R))
    weights = torch.randn(B, R)
    grads = []
    for fn in ("ref", "fused"):
        out = base.clone().requires_grad_(True)
        if fn == "ref":
            lp = _reference(out, targets, P, R, T, vocab)
        else:  # a chunk of two rows' fp32: three chunks over B = 5
            lp = fused_token_log_probs(response_slice(out, P, R), targets, T, vocab, chunk_bytes=2 * R * V * 4)
        (lp * weights).sum().backward()
        grads.append((lp.detach(), out.grad.float()))
    (lp_ref, g_ref), (lp_f, g_f) = grads
    assert lp_f.dtype == torch.float32
    torch.testing.assert_close(lp_f, lp_ref, rtol=0, atol=1e-5)
    torch.testing.assert_close(g_f, g_ref, rtol=0, atol=tol)
    if vocab is not None:  # the padding columns get no gradient, and prompt positions none either
        assert (g_f[..., vocab:] == 0).all()
    assert (g_f[:, : P - 1] == 0).all()


def test_fused_under_no_grad_and_packed_layout():
    """Old/ref log-probs run under no_grad on packed [B, R, V] outputs (advanced indexing: contiguous)."""
    torch.manual_seed(1)
    x = torch.randn(3, 6, 20)
    t = torch.randint(0, 20, (3, 6))
    with torch.no_grad():
        got = fused_token_log_probs(x, t, 1.0, None, chunk_bytes=1)
    ref = torch.log_softmax(x, -1).gather(-1, t[..., None])[..., 0]
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-6)


@pytest.mark.parametrize("T,vocab", [(1.0, None), (0.7, 45)])
def test_fused_log_probs_and_entropy_match_reference(T, vocab):
    """The old-policy pass (no gradient) takes log-probs and entropy from the same row chunks; they
    equal token_log_probs / token_entropy on the fp32 logits, padding masked."""
    from verl_bridge.runtime.logprobs import fused_log_probs_and_entropy, token_entropy

    torch.manual_seed(2)
    B, S, P, V = 4, 9, 3, 50
    R = S - P + 1
    out = 3 * torch.randn(B, S, V)
    targets = torch.randint(0, vocab or V, (B, R))
    z = response_slice(out, P, R) / T
    z = mask_padded_vocab(z, vocab, tp_rank=0)
    ref_lp = torch.log_softmax(z, -1).gather(-1, targets[..., None])[..., 0]
    ref_ent = token_entropy(z)
    lp, ent = fused_log_probs_and_entropy(response_slice(out, P, R), targets, T, vocab, chunk_bytes=R * V * 4)
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-5)
