"""TP=2 (two gloo processes) and TP=1 give the same first-step samples and log-probs."""

import torch

from tests.dist_utils import run_distributed

QUICKSTART = "templates/quickstart.yaml"


def _first_step(rank, world_size, tp):
    from verl_bridge.config import load_config
    from verl_bridge.runtime.experience import compute_log_probs, compute_values
    from verl_bridge.runtime.trainer import MegatronTrainer

    cfg = load_config(QUICKSTART, [f"trainer.args.tp_size={tp}", "trainer.output_dir=null",
                                   "data.rollout_batch_size=16",
                                   "algorithm.mini_batch_size=16", "algorithm.micro_batch_size=8"], world_size=world_size)
    trainer = MegatronTrainer(cfg)
    trainer.setup()
    exp = trainer.rollout(1)
    sizes = dict(pp_size=trainer.layout.pp_size, micro_batch_size=cfg.algorithm.micro_batch_size)
    lp, ent = compute_log_probs(trainer.roles.actor, exp, temperature=cfg.rollout.temperature, with_entropy=True,
                                **sizes)
    values = compute_values(trainer.roles.critic, exp, **sizes)
    return {"response_ids": exp.response_ids, "log_probs": lp, "entropy": ent, "values": values,
            "mask": exp.response_mask}


def test_tp2_matches_tp1_first_step_log_probs():
    tp1 = run_distributed(_first_step, 1, 1)[0]
    tp2 = run_distributed(_first_step, 2, 2)
    # identical samples on every TP rank
    assert torch.equal(tp2[0]["response_ids"], tp2[1]["response_ids"])
    assert torch.equal(tp1["response_ids"], tp2[0]["response_ids"])
    m = tp1["mask"].bool()
    diff = (tp1["log_probs"] - tp2[0]["log_probs"])[m].abs().max().item()
    assert diff <= 1e-5, f"max |logp(TP=1) - logp(TP=2)| = {diff}"
    assert (tp1["entropy"] - tp2[0]["entropy"])[m].abs().max().item() <= 1e-5
    assert torch.allclose(tp1["values"], tp2[1]["values"], atol=1e-5)
