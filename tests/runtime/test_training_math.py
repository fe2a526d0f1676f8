"""Training-path math of issue #17, on real megatron-core GPTModels over gloo (CPU).

- old log-probs / values are computed in eval mode (dropout off), the model left as it was;
- log-probs normalise over the unpadded vocabulary (``hf_vocab_size``), not megatron's padded one;
- ``token-mean`` is one mean over the whole mini-batch: across micro-batches and across DP ranks
  the gradient equals the single-batch gradient;
- a skipped optimizer step (``ok=False``: inf/nan gradients) is counted and moves nothing.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch

from tests.dist_utils import run_distributed
from tests.runtime.gpt_factory import build_gpt

PROMPT, RESPONSE, ROWS = 3, 5, 8
LENGTHS = [5, 1, 2, 5, 1, 4, 1, 3]  # response tokens per row: micro-batches of very unequal token counts


def _experience(rows=slice(None), vocab=50):
    from verl_bridge.common.batch import Experience

    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, vocab, (ROWS, PROMPT), generator=g)
    response = torch.randint(0, vocab, (ROWS, RESPONSE), generator=g)
    mask = (torch.arange(RESPONSE)[None] < torch.tensor(LENGTHS)[:, None]).float()
    response = torch.where(mask.bool(), response, torch.zeros_like(response))
    adv = torch.randn(ROWS, RESPONSE, generator=g) * mask
    exp = Experience(input_ids=torch.cat([prompt, response], 1),
                     attention_mask=torch.cat([torch.ones(ROWS, PROMPT), mask], 1).long(), prompt_len=PROMPT,
                     response_ids=response, response_mask=mask, scores=torch.zeros(ROWS))
    exp.tensors["advantages"] = adv
    return exp.select(torch.arange(ROWS)[rows])


def _config(micro_batch_size, mini_batch_size=ROWS, extra=()):
    from verl_bridge.config import load_config

    return load_config("templates/quickstart.yaml", [
        "algorithm.name=grpo", "model.critic=null", "algorithm.group_size=2", "algorithm.ppo_epochs=1",
        f"algorithm.micro_batch_size={micro_batch_size}", f"algorithm.mini_batch_size={mini_batch_size}",
        "algorithm.entropy_coef=0.01", "trainer.output_dir=null", *extra], world_size=1)


def _model(dropout=0.0):
    torch.manual_seed(0)
    return build_gpt(1, dropout=dropout)


def _log_prob_checks(rank, world_size):
    from megatron.core import parallel_state as mpu

    from verl_bridge.common.batch import model_inputs, response_slice
    from verl_bridge.runtime.experience import compute_log_probs

    mpu.initialize_model_parallel(1, 1)
    exp = _experience()
    out = {}
    # dropout: two old-log-prob passes of a model left in train mode (as after an update) must agree
    model = _model(dropout=0.5)
    model.train()
    lp = partial(compute_log_probs, pp_size=1, temperature=1.0, micro_batch_size=4)
    a, _ = lp(model, exp)
    b, _ = lp(model, exp)
    out["dropout_max_diff"] = float((a - b).abs().max())
    out["still_training"] = model.training
    # padded vocabulary: rows past hf_vocab_size must not take probability mass
    model = _model()
    model.hf_vocab_size = 50
    with torch.no_grad():
        model.output_layer.weight[50:] = 3.0 * torch.randn(14, 32)  # padding rows with large logits
    model.eval()
    with torch.no_grad():
        ids, pos, mask = model_inputs(exp.input_ids, exp.attention_mask)
        logits = response_slice(model(ids, pos, mask), PROMPT, RESPONSE).float()
    expected = torch.log_softmax(logits[..., :50], -1).gather(-1, exp.response_ids[..., None]).squeeze(-1)
    got, ent = lp(model, exp, with_entropy=True)
    m = exp.response_mask.bool()
    out["vocab_max_diff"] = float((got - expected)[m].abs().max())
    p = torch.softmax(logits[..., :50], -1)
    out["entropy_max_diff"] = float((ent - (-(p * p.log()).sum(-1)))[m].abs().max())
    return out


@pytest.fixture(scope="module")
def log_prob_checks():
    return run_distributed(_log_prob_checks, 1)[0]


def test_old_log_probs_are_computed_with_dropout_off(log_prob_checks):
    assert log_prob_checks["dropout_max_diff"] == 0.0
    assert log_prob_checks["still_training"]  # the caller's mode is restored


def test_log_probs_and_entropy_normalise_over_the_unpadded_vocabulary(log_prob_checks):
    assert log_prob_checks["vocab_max_diff"] < 1e-5
    assert log_prob_checks["entropy_max_diff"] < 1e-4


def _grads_after_update(rank, world_size, micro_batch_size, bad_advantage=False):
    """One actor update (GRPO loss + entropy, token-mean) of one mini-batch: the whole batch, split
    over ``world_size`` DP ranks (rank r holds rows r*B/dp .. (r+1)*B/dp); the gradients it left."""
    from megatron.core import parallel_state as mpu

    from verl_bridge.algorithms import ALGORITHMS
    from verl_bridge.runtime.experience import compute_log_probs
    from verl_bridge.runtime.optimizer import TorchOptimizer
    from verl_bridge.runtime.update import actor_loss, update_model

    mpu.initialize_model_parallel(1, 1)
    per_rank = ROWS // world_size
    exp = _experience(slice(rank * per_rank, (rank + 1) * per_rank))
    cfg = _config(micro_batch_size, mini_batch_size=per_rank * world_size)
    model = _model()
    exp.tensors["old_log_probs"] = compute_log_probs(model, exp, pp_size=1, temperature=1.0,
                                                     micro_batch_size=ROWS)[0] - 0.1 * exp.response_mask
    if bad_advantage:
        exp.tensors["advantages"][0, 0] = float("inf")
    before = [p.detach().clone() for p in model.parameters()]
    opt = TorchOptimizer(model, lr=1e-2, weight_decay=0.0, betas=(0.9, 0.999), eps=1e-8, clip_grad=0.0)
    stats = update_model(model, opt, exp, partial(actor_loss, config=cfg, spec=ALGORITHMS["grpo"], kl_coef=0.0),
                         config=cfg, dp_size=world_size, pp_size=1, step=1)
    moved = any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    # numpy arrays travel to the parent by value (a torch tensor would be shared memory that can
    # vanish with this process)
    grads = {n: p.grad.numpy().copy() for n, p in model.named_parameters() if p.grad is not None}
    return grads, stats, moved


def _assert_same_grads(a, b):
    assert a.keys() == b.keys() and a
    for k in a:
        torch.testing.assert_close(torch.from_numpy(a[k]), torch.from_numpy(b[k]), rtol=1e-4, atol=1e-7, msg=k)


@pytest.fixture(scope="module")
def four_micro_batches():
    """One rank, the mini-batch in 4 micro-batches of 2 rows (unequal token counts)."""
    return run_distributed(_grads_after_update, 1, 2)[0]


def test_token_mean_over_micro_batches_is_the_mini_batch_token_mean(four_micro_batches):
    one, stats_one, _ = run_distributed(_grads_after_update, 1, ROWS)[0]
    four, stats_four, _ = four_micro_batches
    _assert_same_grads(four, one)
    # the reported loss is the mini-batch's loss too, however it was split
    assert stats_four["actor_loss"] == pytest.approx(stats_one["actor_loss"], rel=1e-5)
    assert stats_four["pg_loss"] == pytest.approx(stats_one["pg_loss"], rel=1e-5)


def test_token_mean_across_dp_ranks_is_the_global_token_mean(four_micro_batches):
    one, _stats, _moved = four_micro_batches
    two = run_distributed(_grads_after_update, 2, 2)  # 2 DP ranks x 2 micro-batches of 2 rows
    for grads, _stats, _moved in two:
        _assert_same_grads(grads, one)


def test_a_skipped_optimizer_step_is_counted_and_moves_nothing():
    _, stats, moved = run_distributed(_grads_after_update, 1, 4, True)[0]
    assert stats["skipped_steps"] == 1.0
    assert not moved
    assert stats["grad_norm"] == 0.0  # no successful step to average


def test_padding_mask_is_shard_aware():
    """TP=2 over a padded vocabulary of 64 with 50 real ids: shard 0 (ids 0-31) is untouched, shard 1
    (ids 32-63) loses its last 14 columns; together they are the masked full vocabulary."""
    from verl_bridge.runtime.logprobs import mask_padded_vocab

    full = torch.randn(2, 3, 64)
    shards = [mask_padded_vocab(full[..., r * 32:(r + 1) * 32], 50, tp_rank=r) for r in range(2)]
    assert torch.equal(shards[0], full[..., :32])
    joined = torch.cat(shards, -1)
    torch.testing.assert_close(torch.log_softmax(joined, -1)[..., :50], torch.log_softmax(full[..., :50], -1))
    assert torch.softmax(joined, -1)[..., 50:].max() == 0
    assert mask_padded_vocab(full, None) is full and mask_padded_vocab(full, 64, tp_rank=0) is full
