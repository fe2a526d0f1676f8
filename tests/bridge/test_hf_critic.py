"""Hugging Face critic (model.critic.type: huggingface) next to a Megatron actor: call contract,
training, checkpoint resume (legacy + torch_dist), and replication over TP=2 (and PP=2 for the norm)."""

import math
from pathlib import Path

import pytest
import torch

from tests.dist_utils import run_distributed

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hf_critic"
KEYS = ("reward_mean", "kl", "actor_loss", "critic_loss", "critic_grad_norm", "entropy")


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    """The example's own models (examples/hf_critic/make_models.py): a Llama actor, a Qwen2 critic."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_models", EXAMPLE / "make_models.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    d = tmp_path_factory.mktemp("hf_critic_models")
    mod.main(str(d))
    return str(d)


@pytest.mark.parametrize("arch", ["llama", "opt"])
def test_megatron_mask_gives_the_values_of_each_unpadded_sequence(tmp_path, arch):
    """Left/right padded batch through the megatron contract == each sequence alone through transformers."""
    from transformers import AutoModel

    from tests.arch.tiny_hf import make_tiny_hf
    from verl_bridge.common.batch import model_inputs
    from verl_bridge.runtime.hf_critic import HFCritic, build_hf_critic

    make_tiny_hf(arch, tmp_path / arch)
    critic = build_hf_critic(str(tmp_path / arch))
    assert isinstance(critic, HFCritic)
    torch.manual_seed(0)
    torch.nn.init.normal_(critic.value_head.weight)
    plain = AutoModel.from_pretrained(str(tmp_path / arch), dtype=torch.float32).eval()
    seqs, offsets, width = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [20, 21, 22, 23]], [1, 4, 2], 9
    ids = torch.full((3, width), 3)
    attn = torch.zeros(3, width, dtype=torch.long)
    for i, (s, o) in enumerate(zip(seqs, offsets)):
        ids[i, o:o + len(s)] = torch.tensor(s)
        attn[i, o:o + len(s)] = 1
    with torch.no_grad():
        values = critic(*model_inputs(ids, attn))
        assert values.shape == (3, width, 1) and torch.isfinite(values).all()
        for i, (s, o) in enumerate(zip(seqs, offsets)):
            want = critic.value_head(plain(torch.tensor([s])).last_hidden_state)[0]
            torch.testing.assert_close(values[i, o:o + len(s)], want, atol=1e-5, rtol=1e-5)
        # and the mask matters: dropping it (plain causal over the padding) changes the values
        unmasked = critic(ids, torch.arange(width).expand(3, -1), None)
        assert (unmasked[1, 4:7] - values[1, 4:7]).abs().max() > 1e-4
        # ids from megatron's padded vocabulary rows (>= the HF vocabulary of 100) read as token 0
        beyond = ids.clone()
        beyond[0, 2] = 120
        zero = ids.clone()
        zero[0, 2] = 0
        torch.testing.assert_close(critic(*model_inputs(beyond, attn)), critic(*model_inputs(zero, attn)))


def _cfg(out, models, steps, extra=(), world_size=1):
    """examples/hf_critic/ppo.yaml (Megatron actor from an HF Llama dir + HF Qwen2 critic), smaller."""
    from verl_bridge.config import load_config

    return load_config(str(EXAMPLE / "ppo.yaml"), [
        f"model.actor.args.model_name_or_path={models}/actor", f"model.critic.args.model_name_or_path={models}/critic",
        f"trainer.output_dir={out}", f"trainer.total_steps={steps}", "trainer.save_every=2",
        "data.rollout_batch_size=16", "algorithm.mini_batch_size=8", "algorithm.micro_batch_size=8",
        "algorithm.ppo_epochs=1", "trainer.progress_bar=false", *extra], world_size=world_size)


def _train_and_resume(rank, world_size, models, root):
    from verl_bridge.runtime.hf_critic import HFCritic
    from verl_bridge.runtime.trainer import MegatronTrainer

    out = {}
    full = MegatronTrainer(_cfg(f"{root}/full", models, 3))
    out["full"] = full.train()
    assert isinstance(full.roles.critic, HFCritic)
    out["kinds"] = (type(full.roles.actor).__name__, type(full.roles.critic.backbone).__name__)
    out["head_moved"] = float(full.roles.critic.value_head.weight.abs().sum())  # zero-initialised
    for fmt in ("legacy", "torch_dist"):
        MegatronTrainer(_cfg(f"{root}/{fmt}", models, 2, [f"trainer.checkpoint_format={fmt}"])).train()
        resumed = MegatronTrainer(_cfg(f"{root}/{fmt}", models, 3, [f"trainer.checkpoint_format={fmt}",
                                                                     "trainer.resume=auto"]))
        out[fmt] = resumed.train()
        out[fmt + "_head"] = resumed.roles.critic.value_head.weight.detach().clone()
    out["full_head"] = full.roles.critic.value_head.weight.detach().clone()
    return out


def test_hf_critic_trains_and_resumes_exactly(tmp_path, models_dir):
    out = run_distributed(_train_and_resume, 1, models_dir, str(tmp_path))[0]
    full = out["full"]
    assert [r["step"] for r in full] == [1, 2, 3]
    assert all(math.isfinite(r["critic_loss"]) and r["critic_grad_norm"] > 0 for r in full)
    assert out["head_moved"] > 0, "the value head never trained"
    assert out["kinds"] == ("GPTModel", "Qwen2Model")   # megatron actor, transformers critic
    for fmt in ("legacy", "torch_dist"):
        assert (tmp_path / fmt / "checkpoints" / "critic" / "iter_0000002").is_dir()
        assert [r["step"] for r in out[fmt]] == [3], fmt      # resumed after step 2
        for k in KEYS:
            assert out[fmt][0][k] == pytest.approx(full[2][k], rel=1e-5, abs=1e-7), (fmt, k)
        torch.testing.assert_close(out[fmt + "_head"], out["full_head"])


def _tp2(rank, world_size, models, root):
    from megatron.core import parallel_state as mpu

    from verl_bridge.common.batch import model_inputs
    from verl_bridge.runtime.trainer import MegatronTrainer

    cfg = _cfg(f"{root}/tp2", models, 1, ["trainer.args.tp_size=2", "trainer.save_every=0"], world_size=2)
    tr = MegatronTrainer(cfg)
    tr.setup()
    assert mpu.get_tensor_model_parallel_world_size() == 2
    metrics = tr.train_step(1)
    critic, opt = tr.roles.critic, tr.roles.critic_optimizer
    flat = torch.cat([p.detach().reshape(-1) for p in critic.parameters()])
    # one backward on the same batch on both TP ranks: the norm counts the replica once
    ids = torch.randint(0, 16, (4, 10), generator=torch.Generator().manual_seed(5))
    attn = torch.ones_like(ids)
    with torch.no_grad():  # same non-zero head on both ranks, so the backbone gets gradients too
        critic.value_head.weight.copy_(torch.linspace(-1, 1, critic.value_head.weight.numel()).view_as(
            critic.value_head.weight))
    opt.zero_grad()
    critic(*model_inputs(ids, attn)).pow(2).mean().backward()
    local = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in critic.parameters() if p.grad is not None))
    out = {"flat": flat, "norm": opt.grad_norm(), "local": local, "critic_loss": metrics["critic_loss"],
           "opt": type(opt).__name__}
    # the same replicas on two pipeline stages: megatron's TP rule alone would count them twice
    from verl_bridge.runtime.optimizer import TorchOptimizer

    mpu.destroy_model_parallel()
    mpu.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=2)
    out["pp_norm"] = opt.grad_norm()
    out["primary"] = sorted({tuple(sh.replica_id) == (0, 0, 0) for sh in critic.sharded_state_dict().values()})
    out["pp_tp_rule_norm"] = TorchOptimizer(critic, 1e-3, 0.0, (0.9, 0.999), 1e-8, 1.0).grad_norm()
    return out


def test_hf_critic_is_replicated_under_tp2(tmp_path, models_dir):
    r0, r1 = run_distributed(_tp2, 2, models_dir, str(tmp_path))
    assert torch.equal(r0["flat"], r1["flat"]), "TP replicas of the HF critic diverged after a step"
    assert r0["critic_loss"] == r1["critic_loss"] and math.isfinite(r0["critic_loss"])
    assert r0["local"] > 0
    assert r0["norm"] == pytest.approx(r0["local"], rel=1e-9)   # not sqrt(2) x: replicated params count once
    assert r1["norm"] == pytest.approx(r0["norm"], rel=1e-12)
    assert r0["opt"] == "ReplicatedOptimizer"
    assert r0["primary"] == [True] and r1["primary"] == [False]   # torch_dist: one primary copy (PP rank 0)
    assert r0["pp_norm"] == pytest.approx(r0["local"], rel=1e-9)                    # PP=2: still once
    assert r0["pp_tp_rule_norm"] == pytest.approx(math.sqrt(2) * r0["local"], rel=1e-9)
