"""A Mixture-of-Experts actor from a local Hugging Face directory (Qwen2-MoE: routed experts plus a gated
shared expert) trains at EP=2 on two gloo ranks: each rank loads only its own experts from the
safetensors files, the actor's logits match transformers', the architecture resolves to its map, and
two GRPO steps run with the ``moe/*`` metrics."""

import torch

from tests.arch.tiny_moe_hf import make_tiny_moe_hf
from tests.dist_utils import run_distributed


def _ep2_actor_from_hf(rank, world_size, hf_dir, out):
    from transformers import AutoModelForCausalLM

    from verl_bridge.bridge.architecture import resolve_architecture
    from verl_bridge.compat.cpu_device import cpu_device_shims
    from verl_bridge.config import load_config
    from verl_bridge.runtime.trainer import MegatronTrainer

    cfg = load_config("templates/grpo.yaml", [
        "model.actor.args.preset=null", f"model.actor.args.model_name_or_path={hf_dir}", "trainer.args.ep_size=2",
        f"trainer.output_dir={out}", "trainer.total_steps=2", "data.rollout_batch_size=4", "algorithm.group_size=4",
        "algorithm.mini_batch_size=16", "algorithm.micro_batch_size=8", "trainer.progress_bar=false"],
        world_size=world_size)
    trainer = MegatronTrainer(cfg)
    trainer.setup()
    actor = trainer.roles.actor
    local = sorted({n.split("local_experts.")[1].split(".")[0] for n, _ in actor.named_parameters()
                    if "local_experts" in n})
    ids = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), cpu_device_shims():
        ours = actor(ids, torch.arange(12).unsqueeze(0).expand(2, -1), None)[..., :100]
        hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()(ids).logits
    rows = [trainer.train_step(s) for s in (1, 2)]
    return (ours - hf).abs().max().item(), resolve_architecture(actor), local, rows


def test_moe_actor_from_hf_dir_trains_at_ep2(tmp_path):
    make_tiny_moe_hf("qwen2_moe", tmp_path / "hf")
    results = run_distributed(_ep2_actor_from_hf, 2, str(tmp_path / "hf"), str(tmp_path / "run"))
    for diff, arch, local, rows in results:
        assert diff <= 1e-5, f"actor logits differ from transformers by {diff}"
        assert arch == "qwen2_moe" and local == ["0", "1"]  # 4 experts, 2 per EP rank
        assert all(torch.isfinite(torch.tensor(r["actor_loss"])) and r["moe/aux_loss"] > 0 for r in rows)
