"""Dynamic batching (trainer.args.use_dynamic_bsz): micro-batches formed by a token budget and packed
into one row without padding give the same log-probs, losses and gradients as padded micro-batches
(fp32, within 1e-5) on a real megatron-core GPT (portable spec) at TP=1 (in-process) and TP=2 with
sequence parallelism (one 2-process gloo run)."""

import torch

from tests.dist_utils import run_distributed

QUICKSTART = "templates/quickstart.yaml"
VOCAB, P, R = 32, 6, 5


def _experience(n: int = 7, seed: int = 0):
    """Left-padded prompts and right-padded responses of different lengths, with the tensors the loss reads."""
    from verl_bridge.runtime.batch import Experience

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (n, P + R), generator=g)
    am = torch.ones(n, P + R, dtype=torch.long)
    plen = [P, 1, 3, P, 2, 4, 5][:n]
    rlen = [R, 2, 1, 4, R, 3, 1][:n]
    for i in range(n):
        am[i, : P - plen[i]] = 0
        am[i, P + rlen[i]:] = 0
    ids = ids * am
    rmask = am[:, P:].float()
    exp = Experience(input_ids=ids, attention_mask=am, prompt_len=P, response_ids=ids[:, P:],
                     response_mask=rmask, scores=torch.randn(n, generator=g))
    exp.tensors = {"old_log_probs": -3 + 0.1 * torch.randn(n, R, generator=g),
                   "ref_log_probs": -3 + 0.1 * torch.randn(n, R, generator=g),
                   "advantages": torch.randn(n, R, generator=g)}
    return exp


def test_token_budget_micro_batches_and_packing():
    exp = _experience()
    lengths = exp.attention_mask.sum(1).tolist()  # [11, 3, 4, 10, 7, 7, 6]
    micro = exp.token_micro_batches(12)
    groups = [mb.input_ids.tolist() for mb in micro]
    assert sum(len(g) for g in groups) == exp.size
    assert [row for g in groups for row in g] == exp.input_ids.tolist()  # order kept
    for mb in micro:
        n = mb.packed.length
        assert n == int(mb.attention_mask.sum()) and (n <= 12 or mb.size == 1)
        assert torch.equal(mb.packed.input_ids, mb.input_ids[mb.attention_mask.bool()])  # no padding
    assert [mb.packed.length for mb in micro] == [11, 3 + 4, 10, 7, 7, 6]  # the next sample would overflow
    # a sample longer than the budget is a micro-batch of its own
    assert [mb.size for mb in exp.token_micro_batches(8)] == [1, 2, 1, 1, 1, 1]
    # positions restart per sequence; a token attends to earlier tokens of its own sequence only
    mb = exp.token_micro_batches(100)[0]
    p = mb.packed
    assert p.length == sum(lengths)
    assert p.position_ids[: lengths[0]].tolist() == list(range(lengths[0]))
    assert p.position_ids[lengths[0]: lengths[0] + lengths[1]].tolist() == list(range(lengths[1]))
    ids, pos, mask = p.inputs(p.length + 3)
    assert ids.shape == (1, p.length + 3) and mask.shape == (1, 1, p.length + 3, p.length + 3)
    a, b = lengths[0], lengths[0] + lengths[1]
    assert not mask[0, 0, a + 1, a] and mask[0, 0, a + 1, a - 1] and mask[0, 0, a, a + 1]
    assert mask[0, 0, -1].sum() == p.length + 2 and not mask[0, 0, -1, -1]  # padding: itself only
    # index: the packed position that predicts each response token is the previous real token
    i = 1
    start = lengths[0]
    assert p.index[i, 0] == start + 1 - 1 + 0  # prompt of 1 token: it predicts response token 0
    assert p.index[i, 1] == start + 1  # response token 0 predicts response token 1
    assert p.input_ids[p.index[i, 1]] == exp.response_ids[i, 0]
    assert p.input_ids[b - 1] == exp.response_ids[i, 1]  # its response has 2 tokens: the segment ends there


def _check(tp: int, sp: bool):
    """Padded vs packed: old log-probs, entropy, actor loss and gradients of one update pass."""
    from functools import partial

    from verl_bridge.algorithms.registry import ALGORITHMS
    from verl_bridge.config import load_config
    from verl_bridge.config.schema import ModelArgs
    from verl_bridge.distributed import seed_everything
    from verl_bridge.models.tiny import tiny_model_provider
    from verl_bridge.runtime.experience import compute_log_probs
    from verl_bridge.runtime.forward import forward_micro_batches
    from verl_bridge.runtime.grads import finalize_grads
    from verl_bridge.runtime.logprobs import unpadded_vocab_size
    from verl_bridge.runtime.update import actor_loss, global_batch

    cfg = load_config(QUICKSTART, ["trainer.output_dir=null", "algorithm.entropy_coef=0.01",
                                   "algorithm.kl.placement=loss", "algorithm.kl.coef=0.1",
                                   f"trainer.args.tp_size={tp}"], world_size=tp)
    seed_everything(0)
    model = tiny_model_provider(ModelArgs(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2),
                                VOCAB, 64, tp_size=tp, sequence_parallel=sp)(True, True)
    exp = _experience()
    out = {}
    for name, kw in (("padded", dict(micro_batch_size=2)), ("packed", dict(micro_batch_size=2, max_tokens=24))):
        lp, ent = compute_log_probs(model, exp, pp_size=1, temperature=1.0, with_entropy=True, **kw)
        micro = exp.split(kw["micro_batch_size"], kw.get("max_tokens"))
        share = partial(actor_loss, config=cfg, spec=ALGORITHMS[cfg.algorithm.name], kl_coef=0.1,
                        global_batch=global_batch(exp.response_mask, 1), loss_scale=float(len(micro)),
                        vocab_size=unpadded_vocab_size(model))
        model.zero_grad()
        model.train()
        res = forward_micro_batches(model, micro, share, pp_size=1, forward_only=False)
        finalize_grads(model, dp_size=1)
        out[name] = dict(lp=lp, ent=ent, loss=sum(r["actor_loss"] for r in res) / len(res), n=len(micro),
                         grads={n: p.grad.clone() for n, p in model.named_parameters()})
    return out


def _compare(out, mask):
    a, b = out["padded"], out["packed"]
    m = mask.bool()
    assert b["n"] < a["n"]  # fewer, fuller micro-batches
    assert (a["lp"] - b["lp"])[m].abs().max() <= 1e-5
    assert (a["ent"] - b["ent"])[m].abs().max() <= 1e-5
    assert abs(a["loss"] - b["loss"]) <= 1e-5 * max(1.0, abs(a["loss"]))
    for n, g in a["grads"].items():
        assert g.abs().max() > 0, n  # every parameter got a gradient
        assert torch.allclose(g, b["grads"][n], atol=1e-5, rtol=1e-4), (n, (g - b["grads"][n]).abs().max())


def test_packed_equals_padded_tp1():
    from verl_bridge.distributed import init_model_parallel

    init_model_parallel(1, 1)
    _compare(_check(1, False), _experience().response_mask)


def _tp2(rank, world_size):
    from verl_bridge.distributed import init_model_parallel

    init_model_parallel(world_size, 1)
    return _check(world_size, True)


def test_packed_equals_padded_tp2_sequence_parallel():
    for out in run_distributed(_tp2, 2):
        _compare(out, _experience().response_mask)
