"""Virtual pipeline (VPP=2) at PP=2 through megatron-core's interleaved schedule equals PP=1.

Two gloo ranks, 4 layers, two model chunks per rank (stage 0 holds layers 0 and 2, stage 1 layers
1 and 3), the same weights as a one-rank model: one mini-batch of the PPO actor loss through
``forward_micro_batches`` (megatron's ``forward_backward_pipelining_with_interleaving`` via the CPU
shims), then one optimizer step. Losses and every updated weight are compared.
"""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import pytest
import torch

from tests.dist_utils import run_distributed

ARGS = dict(num_layers=4, hidden_size=32, num_attention_heads=4, num_query_groups=None, ffn_hidden_size=64)


def _loss_and_step(chunks, exp, cfg, pp):
    from verl_bridge.algorithms.registry import ALGORITHMS
    from verl_bridge.runtime.forward import forward_micro_batches
    from verl_bridge.runtime.optimizer import TorchOptimizer
    from verl_bridge.runtime.update import actor_loss, global_batch

    params = torch.nn.ModuleList(chunks)
    opt = TorchOptimizer(params, lr=1e-2, weight_decay=0.0, betas=(0.9, 0.999), eps=1e-8, clip_grad=0.0)
    micro = exp.micro_batches(2)
    fn = partial(actor_loss, config=cfg, spec=ALGORITHMS["ppo"], kl_coef=0.0,
                 global_batch=global_batch(exp.response_mask, 1), loss_scale=float(len(micro)))
    opt.zero_grad()
    res = forward_micro_batches(chunks if len(chunks) > 1 else chunks[0], micro, fn, pp_size=pp, forward_only=False)
    ok, norm = opt.step()
    return [r["actor_loss"] for r in res], norm


def _worker(rank, world_size, vp, full_state):
    from megatron.core import parallel_state as mpu

    from tests.layout.test_pp_equivalence import _experience, _local_weights
    from verl_bridge.config import load_config
    from verl_bridge.models.tiny import tiny_model_provider

    pp = world_size
    mpu.initialize_model_parallel(1, pp, virtual_pipeline_model_parallel_size=vp)
    torch.manual_seed(0)
    provider = tiny_model_provider(SimpleNamespace(**ARGS), 16, 32, vp_size=vp)
    chunks = []
    for i in range(vp or 1):
        pre = mpu.is_pipeline_first_stage(ignore_virtual=False, vp_stage=i) if vp else mpu.is_pipeline_first_stage()
        post = mpu.is_pipeline_last_stage(ignore_virtual=False, vp_stage=i) if vp else mpu.is_pipeline_last_stage()
        chunks.append(provider(pre, post, vp_stage=i if vp else None).eval())  # no dropout: comparable runs
    if full_state is None:
        full_state = {}
        for c in chunks:
            full_state.update(_local_weights(c))
    from verl_bridge.arch.convert import to_global_name

    with torch.no_grad():
        for c in chunks:
            layers = c.decoder.layers
            offset = layers[0].layer_number - 1
            for k, v in c.state_dict().items():
                if not k.endswith("_extra_state"):
                    v.copy_(full_state[to_global_name(k, offset)])
    cfg = load_config("templates/quickstart.yaml", ["trainer.output_dir=null", f"trainer.args.pp_size={pp}"],
                      world_size=world_size)
    exp = _experience()
    g = torch.Generator().manual_seed(1)
    exp.tensors["old_log_probs"] = -2.8 + 0.1 * torch.randn(exp.response_ids.shape, generator=g)
    exp.tensors["advantages"] = torch.randn(exp.response_ids.shape, generator=g)
    losses, norm = _loss_and_step(chunks, exp, cfg, pp)
    after = {}
    for c in chunks:
        after.update(_local_weights(c))
    return {"losses": losses, "norm": norm, "after": after, "before": full_state,
            "layers": sorted(int(k.split(".")[2]) for k in after if k.endswith("input_layernorm.weight"))}


@pytest.mark.slow
def test_vpp2_interleaved_schedule_equals_pp1():
    ref = run_distributed(_worker, 1, None, None)[0]
    runs = run_distributed(_worker, 2, 2, ref["before"])
    assert runs[0]["layers"] == [0, 2] and runs[1]["layers"] == [1, 3]  # interleaved chunks
    last = runs[1]
    dl = max(abs(a - b) for a, b in zip(ref["losses"], last["losses"]))
    merged = {**runs[0]["after"], **runs[1]["after"]}
    assert set(merged) == set(ref["after"])
    dw = max((merged[k] - ref["after"][k]).abs().max().item() for k in merged)
    moved = max((ref["after"][k] - ref["before"][k]).abs().max().item() for k in merged)
    print(f"VPP=2 vs PP=1: losses {dl:.2e}, grad norm {abs(ref['norm'] - last['norm']):.2e}, weights {dw:.2e} "
          f"(the step moved weights by up to {moved:.2e})")
    assert len(last["losses"]) == len(ref["losses"]) == 4
    assert dl <= 1e-5 and abs(ref["norm"] - last["norm"]) <= 1e-5 and dw <= 1e-5 and moved > 1e-4
