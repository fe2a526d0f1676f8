"""Dynamic batching (trainer.args.use_dynamic_bsz): micro-batches formed by a token budget and packed
into one row without padding give the same log-probs, losses and gradients as padded micro-batches
(fp32, within 1e-5) on a real megatron-core GPT (portable spec) at TP=1 (in-process), and TP=2 with
sequence parallelism then PP=2 (one 2-process gloo run)."""

import torch

from tests.dist_utils import run_distributed

QUICKSTART = "templates/quickstart.yaml"
VOCAB, P, R = 32, 6, 5


def _experience(n: int = 7, seed: int = 0):
    """Left-padded prompts and right-padded responses of different lengths, with the tensors the loss reads."""
    from verl_bridge.common.batch import Experience

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
    lengths = exp.attention_mask.sum(1).tolist()
    assert lengths == [11, 3, 4, 10, 7, 7, 6]
    micro = exp.token_micro_batches(12)
    assert [row for mb in micro for row in mb.input_ids.tolist()] == exp.input_ids.tolist()  # order kept
    assert [int(mb.attention_mask.sum()) for mb in micro] == [11, 3 + 4, 10, 7, 7, 6]  # the next would overflow
    for mb in micro:  # no padding inside: the rows hold exactly the real tokens
        assert torch.equal(mb.packed.input_ids[mb.packed.segments >= 0], mb.input_ids[mb.attention_mask.bool()])
    # a sample longer than the budget is a micro-batch of its own
    assert [mb.size for mb in exp.token_micro_batches(8)] == [1, 2, 1, 1, 1, 1]
    # rows are never longer than the padded length (11 here): attention costs no more than padded
    p = exp.token_micro_batches(100)[0].packed
    assert p.length == 11 and [int((r >= 0).sum()) for r in p.segments] == [11, 7, 10, 7, 7, 6]
    # one long row: positions restart per sequence; a token attends to earlier tokens of its own sequence
    p = exp.token_micro_batches(100, row_tokens=100)[0].packed
    assert p.rows == 1 and p.length == sum(lengths)
    pos = p.position_ids[0]
    assert pos[: lengths[0]].tolist() == list(range(lengths[0]))
    assert pos[lengths[0]: lengths[0] + lengths[1]].tolist() == list(range(lengths[1]))
    ids, _, mask = p.inputs(p.length + 3, rows=2)
    assert ids.shape == (2, p.length + 3) and mask.shape == (2, 1, p.length + 3, p.length + 3)
    a, b = lengths[0], lengths[0] + lengths[1]
    m = mask[0, 0]
    assert not m[a + 1, a] and m[a + 1, a - 1] and m[a, a + 1]
    assert m[-1].sum() == p.length + 2 and not m[-1, -1]  # padding attends to itself only
    assert all(not mask[1, 0, i, i] and mask[1, 0, i].sum() == p.length + 2 for i in range(p.length + 3))
    # the packed position that predicts each response token is the previous real token
    i = 1  # a prompt of 1 token and a response of 2
    assert p.col[i, 0] == a and p.col[i, 1] == a + 1 and p.row[i, 0] == 0
    assert p.input_ids[0, p.col[i, 1]] == exp.response_ids[i, 0]
    assert p.input_ids[0, b - 1] == exp.response_ids[i, 1]


def _check(tp: int, pp: int, sp: bool):
    """Padded vs packed (the config keys, through compute_log_probs and update_model): old log-probs,
    entropy, actor loss and the gradients of one update (finalized: SP norms summed over TP)."""
    from functools import partial

    from megatron.core import parallel_state as mpu

    from verl_bridge.algorithms.registry import ALGORITHMS
    from verl_bridge.config import load_config
    from verl_bridge.config.schema import ModelArgs
    from verl_bridge.distributed import seed_everything
    from verl_bridge.models.tiny import tiny_model_provider
    from verl_bridge.runtime.experience import compute_log_probs
    from verl_bridge.runtime.optimizer import TorchOptimizer
    from verl_bridge.runtime.update import actor_loss, max_tokens_per_micro_batch, update_model

    common = ["trainer.output_dir=null", "algorithm.entropy_coef=0.01", "algorithm.kl.placement=loss",
              "algorithm.kl.coef=0.1", "algorithm.micro_batch_size=2",
              f"trainer.args.tp_size={tp}", f"trainer.args.pp_size={pp}"]
    configs = {"padded": load_config(QUICKSTART, common, world_size=tp * pp),
               # 11+3+4 | 10+7 | 7+6 real tokens: odd lengths take the sequence-parallel padding
               "packed": load_config(QUICKSTART, common + ["trainer.args.use_dynamic_bsz=true",
                                                          "trainer.args.max_tokens_per_micro_batch=21"],
                                     world_size=tp * pp)}
    seed_everything(0)
    args = ModelArgs(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2)
    model = tiny_model_provider(args, VOCAB, 64, tp_size=tp, sequence_parallel=sp)(
        mpu.is_pipeline_first_stage(), mpu.is_pipeline_last_stage())
    start = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in model.state_dict().items()}
    exp = _experience()
    out = {}
    for name, cfg in configs.items():
        model.load_state_dict(start)
        tok = max_tokens_per_micro_batch(cfg)
        lp, ent = compute_log_probs(model, exp, pp_size=pp, temperature=1.0, micro_batch_size=2,
                                    with_entropy=True, max_tokens=tok)
        opt = TorchOptimizer(model, lr=1e-2, weight_decay=0.0, betas=(0.9, 0.999), eps=1e-8, clip_grad=0.0)
        stats = update_model(model, opt, exp, partial(actor_loss, config=cfg, spec=ALGORITHMS[cfg.algorithm.name], kl_coef=0.1),
                             config=cfg, dp_size=1, pp_size=pp, step=1)
        out[name] = dict(lp=lp, ent=ent, loss=stats["actor_loss"], n=len(exp.split(2, tok)),
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
    _compare(_check(1, 1, False), _experience().response_mask)


def _two_ranks(rank, world_size):
    """TP=2 with sequence parallelism, then PP=2 (one packed length for every micro-batch), one launch."""
    from megatron.core import parallel_state as mpu

    from verl_bridge.distributed import init_model_parallel

    init_model_parallel(world_size, 1)
    tp = _check(world_size, 1, True)
    mpu.destroy_model_parallel()
    init_model_parallel(1, world_size)
    return {"tp": tp, "pp": _check(1, world_size, False)}


def test_packed_equals_padded_tp2_sequence_parallel_and_pp2():
    for out in run_distributed(_two_ranks, 2):
        _compare(out["tp"], _experience().response_mask)
        _compare(out["pp"], _experience().response_mask)


def test_bad_dynamic_batching_config_is_refused_with_what_is_allowed():
    import pytest

    from verl_bridge.config import ConfigError, load_config

    with pytest.raises(ConfigError) as e:
        load_config(QUICKSTART, ["trainer.output_dir=null", "trainer.args.use_dynamic_bsz=true"])
    assert "trainer.args.max_tokens_per_micro_batch" in str(e.value) and "integer >= 1" in str(e.value)
    with pytest.raises(ConfigError, match="trainer.args.max_tokens_per_micro_batch"):
        load_config(QUICKSTART, ["trainer.output_dir=null", "trainer.args.use_dynamic_bsz=true",
                                 "trainer.args.max_tokens_per_micro_batch=0"])
    cfg = load_config(QUICKSTART, ["trainer.output_dir=null", "trainer.args.use_dynamic_bsz=true",
                                   "trainer.args.max_tokens_per_micro_batch=4096"])
    assert cfg.trainer.args.use_dynamic_bsz is True and cfg.trainer.args.max_tokens_per_micro_batch == 4096
