"""Checkpoints of an expert-parallel MoE actor (tiny-moe, EP=2 on two gloo ranks), both formats.

One launch at EP=2 trains one step, saves it as legacy (``mp_rank_00_000`` and ``mp_rank_00_001``:
Megatron-LM's names, one per EP rank, each holding its own two experts; before the fix only DP rank 0
wrote, losing EP rank 1's experts) and as torch_dist, scrambles the weights and the optimizer state,
and resumes each: weights and Adam state back bit-exactly. The same processes then set up EP=1 (each
holding all four experts) and load the EP=2 torch_dist checkpoint through megatron's
dist-checkpointing, which regroups the experts by their global index: every weight bit-exact.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.dist_utils import run_distributed

TEMPLATE = "templates/moe_grpo.yaml"


def _overrides(ep: int, out: str | None, fmt: str = "legacy") -> list[str]:
    return [f"trainer.args.ep_size={ep}", f"trainer.output_dir={out}" if out else "trainer.output_dir=null",
            f"trainer.checkpoint_format={fmt}", "trainer.total_steps=1", "trainer.nproc_per_node=1",
            "trainer.progress_bar=false", "data.rollout_batch_size=2", "algorithm.group_size=4",
            "algorithm.ppo_epochs=1", "algorithm.mini_batch_size=8", "algorithm.micro_batch_size=4",
            "model.actor.args.hidden_size=32", "trainer.loggers=[jsonl]"]


def _global(model, ep_rank: int, n_local: int) -> dict[str, torch.Tensor]:
    from tests.runtime.test_moe import _weights

    return _weights(model, ep_rank, n_local)


def _adam(opt) -> list[torch.Tensor]:
    return [t.clone() for s in opt.optimizer.state.values() for t in (s["exp_avg"], s["exp_avg_sq"])]


def _ep2_save_and_resume(rank, world_size, root):
    from megatron.core import parallel_state as mpu

    from verl_bridge.checkpoint.trainer_state import resume_trainer, save_trainer_checkpoint
    from verl_bridge.config import load_config
    from verl_bridge.runtime.trainer import MegatronTrainer

    cfg = load_config(TEMPLATE, _overrides(2, os.path.join(root, "legacy")), world_size=world_size)
    trainer = MegatronTrainer(cfg)
    trainer.train()  # one step, saved at the end (legacy)
    state = trainer.state
    actor, opt = state.roles.actor, state.roles.actor_optimizer
    ep_rank = mpu.get_expert_model_parallel_rank()
    weights, adam = _global(actor, ep_rank, 2), _adam(opt)
    cfg.trainer.output_dir = os.path.join(root, "torch_dist")
    cfg.trainer.checkpoint_format = "torch_dist"
    save_trainer_checkpoint(state, 1)
    out = {"ep_rank": ep_rank, "weights": weights}
    for fmt in ("legacy", "torch_dist"):
        with torch.no_grad():  # scramble, then resume
            for p in actor.parameters():
                p.normal_()
            for s in opt.optimizer.state.values():
                s["exp_avg"].zero_()
        cfg.trainer.output_dir, cfg.trainer.checkpoint_format, cfg.trainer.resume = os.path.join(root, fmt), fmt, "auto"
        step = resume_trainer(state)
        got, got_adam = _global(actor, ep_rank, 2), _adam(opt)
        out[fmt] = {"step": step, "weights_equal": all(torch.equal(weights[k], got[k]) for k in weights),
                    "adam_equal": len(adam) == len(got_adam) and all(torch.equal(a, b) for a, b in zip(adam, got_adam))}
    # the same two processes at EP=1 (each holding all four experts) load the EP=2 torch_dist checkpoint
    trainer.engine = None
    mpu.destroy_model_parallel()
    out["ep1"] = _ep1_load(world_size, root)
    return out


def _ep1_load(world_size, root):
    from verl_bridge.bridge import MegatronBridge
    from verl_bridge.checkpoint import megatron as mckpt
    from verl_bridge.config import load_config

    cfg = load_config(TEMPLATE, _overrides(1, None), world_size=world_size)
    bridge = MegatronBridge.from_config(cfg)
    bridge.initialize()
    actor = bridge.actor_builder()()
    with torch.no_grad():
        for p in actor.parameters():
            p.zero_()
    mckpt.load(os.path.join(root, "torch_dist", "checkpoints", "actor"), model=actor)
    return _global(actor, 0, 4)


@pytest.mark.timeout(600)
def test_moe_checkpoints_ep2_both_formats_and_ep2_to_ep1(tmp_path):
    root = str(tmp_path)
    ep2 = run_distributed(_ep2_save_and_resume, 2, root)
    legacy = tmp_path / "legacy" / "checkpoints" / "actor" / "iter_0000001"
    assert sorted(p.name for p in legacy.iterdir() if p.is_dir()) == ["mp_rank_00_000", "mp_rank_00_001"]
    for r in ep2:
        for fmt in ("legacy", "torch_dist"):
            assert r[fmt] == {"step": 1, "weights_equal": True, "adam_equal": True}, (r["ep_rank"], fmt, r[fmt])

    from verl_bridge.checkpoint.safe_load import safe_load

    for ep_rank in (0, 1):  # each EP rank's file holds its own two experts (local indices 0, 1)
        sd = safe_load(legacy / f"mp_rank_00_{ep_rank:03d}" / "model_optim_rng.pt")["model"]
        mine = next(r for r in ep2 if r["ep_rank"] == ep_rank)["weights"]
        name = "decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight"
        assert torch.equal(sd[name], mine[name.replace("local_experts.1", f"local_experts.{2 * ep_rank + 1}")])

    merged = {**ep2[0]["weights"], **ep2[1]["weights"]}
    for r in ep2:
        ep1 = r["ep1"]
        assert set(ep1) == set(merged) and sum("local_experts" in k for k in ep1) == 2 * 4 * 2  # layers x experts x fc
        assert all(torch.equal(ep1[k], merged[k]) for k in merged)

    # the EP=2 checkpoints (both layouts) convert to Hugging Face: the tiny-moe preset is Mixtral's layout,
    # and transformers' MixtralForCausalLM loads every expert, gathered from both EP ranks' files
    from transformers import AutoModelForCausalLM

    from verl_bridge.arch import mcore_to_hf
    from verl_bridge.arch.convert import ModelDims
    from verl_bridge.checkpoint.hf import export_hf

    dims = ModelDims(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=4, head_dim=8,
                     ffn_hidden_size=64, gated_linear_unit=True, vocab_size=16, num_experts=4)
    want = {n: t for k, v in merged.items() for n, t in mcore_to_hf(k, v, "mixtral", dims)}
    for fmt in ("legacy", "torch_dist"):
        hf_dir = tmp_path / f"hf-{fmt}"
        export_hf(tmp_path / fmt / "checkpoints" / "actor", hf_dir)
        hf = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
        assert type(hf).__name__ == "MixtralForCausalLM"
        from verl_bridge.arch.hf import SafetensorsDir

        got = SafetensorsDir(hf_dir)
        assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want), fmt
        assert sum(".experts." in k for k in got) == 2 * 4 * 3  # layers x experts x (w1, w2, w3)
