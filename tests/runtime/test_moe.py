"""Mixture-of-Experts actors (the ``tiny-moe`` preset: megatron-core's own MoE layer on the portable spec).

One PPO/GRPO actor update at EP=2 (two gloo ranks, experts 0-1 on rank 0 and 2-3 on rank 1) equals
the same update at EP=1 (one rank holding all four experts) from the same weights and batch, fp32:
losses, ``moe/*`` metrics, grad norm and every updated weight (expert shards mapped back to global
expert indices). The EP=1 run takes the batch in two micro-batches that hold exactly the rows each
EP=2 rank holds, so the load-balancing loss (computed per micro-batch on its own tokens, as
megatron does) is the same sum of terms on both sides.

Also: the aux loss reaches the router's gradient with its coefficient (a backward of a zero main
loss leaves gradient only on the routers), the CPU router shim is in place, and bad MoE configs
are refused by name.
"""

from __future__ import annotations

import pytest
import torch

from tests.dist_utils import run_distributed

TEMPLATE = "templates/moe_grpo.yaml"
B, P, R = 8, 6, 4
TOL_LOSS = 1e-6
TOL_WEIGHT = 1e-5


def _overrides(ep: int) -> list[str]:
    return [f"trainer.args.ep_size={ep}", "trainer.output_dir=null", "trainer.nproc_per_node=1",
            "data.rollout_batch_size=2", "algorithm.group_size=4", "algorithm.ppo_epochs=1",
            "algorithm.mini_batch_size=8", "algorithm.micro_batch_size=4", "model.actor.args.hidden_size=32",
            "model.actor.args.moe_aux_loss_coeff=0.05"]


def _batch():
    from verl_bridge.common.batch import Experience

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 16, (B, P + R), generator=g)
    am = torch.ones(B, P + R, dtype=torch.long)
    am[1, :2] = 0  # left padding on one prompt
    am[6, P + 2:] = 0  # a response that ended early
    return Experience(input_ids=ids, attention_mask=am, prompt_len=P, response_ids=ids[:, P:].clone(),
                      response_mask=am[:, P:].float(), scores=torch.rand(B, generator=g))


def _global_name(name: str, ep_rank: int, n_local: int) -> str:
    """``...local_experts.i...`` of EP rank ``ep_rank`` -> the global expert index."""
    key = "local_experts."
    if key not in name:
        return name
    head, tail = name.split(key, 1)
    i, rest = tail.split(".", 1)
    return f"{head}{key}{ep_rank * n_local + int(i)}.{rest}"


def _weights(model, ep_rank: int, n_local: int) -> dict[str, torch.Tensor]:
    return {_global_name(k, ep_rank, n_local): v.detach().clone() for k, v in model.state_dict().items()
            if not k.endswith("_extra_state") and v is not None}


def _load(model, full: dict, ep_rank: int, n_local: int) -> None:
    with torch.no_grad():
        for k, v in model.state_dict().items():
            if not k.endswith("_extra_state") and v is not None:
                v.copy_(full[_global_name(k, ep_rank, n_local)])


def _worker(rank, world_size, ep, init):
    from megatron.core import parallel_state as mpu

    from verl_bridge.compat.moe import is_expert_param
    from verl_bridge.config import load_config
    from verl_bridge.runtime.experience import make_experience
    from verl_bridge.runtime.forward import forward_micro_batches
    from verl_bridge.runtime.trainer import MegatronTrainer
    from verl_bridge.runtime.update import update

    # routing replay on (R3): without replay data (a fixed batch) megatron routes as usual
    cfg = load_config(TEMPLATE, [*_overrides(ep), "algorithm.moe_routing_replay=true"], world_size=world_size)
    trainer = MegatronTrainer(cfg)
    trainer.setup()
    layout, roles = trainer.layout, trainer.roles
    actor = roles.actor
    n_local = 4 // ep
    ep_rank = mpu.get_expert_model_parallel_rank()
    out = {"router": type(actor.decoder.layers[0].mlp.router).__name__,
           "expert_params": sum(is_expert_param(p) for p in actor.parameters()),
           "local_experts": sum("local_experts" in n for n, _ in actor.named_parameters()), "ep_size": layout.ep_size}
    if init is None:
        init = _weights(actor, ep_rank, n_local)
        out["init"] = init
    else:
        _load(actor, init, ep_rank, n_local)
        _load(roles.reference, init, ep_rank, n_local)

    full = _batch()
    state, spec = trainer.state, trainer.spec
    half = B // world_size
    exp = full.select(torch.arange(rank * half, (rank + 1) * half))
    stats = make_experience(exp, state, spec)
    if world_size == 1:
        # the update shuffles with randperm(B, seed + step) and cuts micro-batches of 4 in that order: arrange
        # the rows so the two micro-batches are exactly rows 0-3 and 4-7, the two EP=2 ranks' shares
        perm = torch.randperm(B, generator=torch.Generator().manual_seed(cfg.trainer.seed + 1))
        exp = exp.select(torch.argsort(perm))

        # the aux loss alone (main loss x 0) reaches the routers only, scaled by the coefficient
        actor.train()
        actor.zero_grad(set_to_none=True)
        forward_micro_batches(actor, exp.micro_batches(4), lambda mb, o: (o.float().sum() * 0.0, {}), pp_size=1,
                              forward_only=False)
        grads = {n: (p.grad.norm().item() if p.grad is not None else 0.0) for n, p in actor.named_parameters()}
        out["aux_only_router_grad"] = min(v for n, v in grads.items() if "router" in n)
        out["aux_only_output_grad"] = grads["output_layer.weight"]
        actor.zero_grad(set_to_none=True)
    metrics = update(exp, state, spec, step=1)
    out.update(stats=stats, metrics=metrics, ep_rank=ep_rank, final=_weights(actor, ep_rank, n_local))
    if world_size == 1:
        out["replay"] = _replay_checks(trainer)
    return out


@pytest.mark.timeout(600)
def test_moe_ep2_update_equals_ep1_and_routing_replay():
    ep1 = run_distributed(_worker, 1, 1, None)[0]
    ep2 = run_distributed(_worker, 2, 2, ep1["init"])

    assert ep1["router"].startswith("CpuSafe") and all(r["router"].startswith("CpuSafe") for r in ep2)
    assert [r["ep_size"] for r in ep2] == [2, 2] and sorted(r["ep_rank"] for r in ep2) == [0, 1]
    # half the experts on each EP rank, marked for the expert-data-parallel reduction (at EP=1 they are dense)
    assert ep2[0]["expert_params"] == ep2[0]["local_experts"] == ep1["local_experts"] // 2 > 0
    assert ep1["aux_only_router_grad"] > 1e-6, "the load-balancing loss did not reach the router"
    assert ep1["aux_only_output_grad"] == 0.0

    m1 = ep1["metrics"]
    m2 = {k: sum(r["metrics"][k] for r in ep2) / 2 for k in m1}  # the trainer's DP mean
    for key in ("actor_loss", "pg_loss", "grad_norm", "moe/aux_loss", "moe/tokens_per_expert_cv"):
        assert abs(m1[key] - m2[key]) < TOL_LOSS, (key, m1[key], m2[key])
    assert m1["moe/aux_loss"] > 0.5  # ~1 for a near-uniform router (megatron's normalisation)
    assert ep2[0]["metrics"]["moe/tokens_per_expert_cv"] == ep2[1]["metrics"]["moe/tokens_per_expert_cv"]

    final2 = {**ep2[0]["final"], **ep2[1]["final"]}
    assert set(final2) == set(ep1["final"])
    worst = max((ep1["final"][k] - final2[k]).abs().max().item() for k in final2)
    moved = max((ep1["final"][k] - ep1["init"][k]).abs().max().item() for k in final2 if "local_experts" in k)
    assert worst < TOL_WEIGHT, worst
    assert moved > 1e-4  # the experts did train
    _check_replay(ep1["replay"])
    print(f"\nEP=2 vs EP=1: actor_loss diff {abs(m1['actor_loss'] - m2['actor_loss']):.2e}, "
          f"aux_loss {m1['moe/aux_loss']:.4f} (diff {abs(m1['moe/aux_loss'] - m2['moe/aux_loss']):.2e}), "
          f"grad_norm diff {abs(m1['grad_norm'] - m2['grad_norm']):.2e}, max weight diff {worst:.2e}")


def test_moe_config_refusals():
    from verl_bridge.config import load_config
    from verl_bridge.config.loader import ConfigError

    with pytest.raises(ConfigError) as exc:
        load_config(TEMPLATE, ["trainer.args.ep_size=3", "model.actor.args.moe_router_topk=5"], world_size=2)
    msg = str(exc.value)
    assert "trainer.args.ep_size=3 does not divide the data-parallel size 2" in msg
    assert "model.actor.args.num_experts=4 does not divide over trainer.args.ep_size=3" in msg
    assert "model.actor.args.moe_router_topk=5 exceeds num_experts=4" in msg
    with pytest.raises(ConfigError) as exc:
        load_config(TEMPLATE, ["model.actor.args.preset=tiny"], world_size=2)
    assert "trainer.args.ep_size=2 needs a Mixture-of-Experts actor; preset='tiny' is dense" in str(exc.value)
    assert "model.actor.args.num_experts is set but preset='tiny' is dense" in str(exc.value)
    load_config(TEMPLATE, world_size=2)  # the template itself is valid at 2 ranks


def _replay_checks(trainer) -> dict:
    """Routing replay (R3) on a trainer built with algorithm.moe_routing_replay=true (one rank)."""
    from verl_bridge.runtime.experience import compute_log_probs
    from verl_bridge.common.routing_replay import ROUTED_KEY, replay_objects
    from verl_bridge.runtime.update import update

    actor = trainer.roles.actor
    exp = trainer.rollout(1)
    routed = exp.tensors[ROUTED_KEY]
    out = {"shape": tuple(routed.shape), "ids_shape": tuple(exp.input_ids.shape),
           "replays": len(replay_objects(actor)), "engine_records": trainer.engine.record_routing}
    # the recorded choices are the model's own: a teacher-forced forward (no replay) routes the same
    from verl_bridge.compat.cpu_device import cpu_device_shims
    from verl_bridge.common.batch import model_inputs
    from verl_bridge.common.routing_replay import RoutingRecorder

    actor.eval()
    rec = RoutingRecorder(actor)
    with torch.no_grad(), cpu_device_shims():
        actor(*model_inputs(exp.input_ids, exp.attention_mask))
    rec.step(exp.size)
    forced = rec.result(exp.size, exp.input_ids.shape[1], exp.input_ids.device)
    rec.close()
    fed = exp.attention_mask.bool()
    out["match"] = float((forced == routed).all(-1).all(-1)[fed].float().mean())
    sizes = dict(pp_size=1, micro_batch_size=4)
    lp_replay = compute_log_probs(actor, exp, temperature=1.0, **sizes)[0]
    flipped = exp.select(torch.arange(exp.size))
    flipped.tensors[ROUTED_KEY] = (routed + 1) % 4  # other experts: the replay is what routes
    lp_flipped = compute_log_probs(actor, flipped, temperature=1.0, **sizes)[0]
    mask = exp.response_mask.bool()
    out["replay_vs_flipped"] = float((lp_replay - lp_flipped).abs()[mask].max())
    out["replays_cleared"] = all(r.router_replay_action is None and r.target_topk_idx is None
                                 for r in replay_objects(actor))
    from verl_bridge.runtime.experience import make_experience

    make_experience(exp, trainer.state, trainer.spec)
    metrics = update(exp, trainer.state, trainer.spec, step=1)
    out["update_ok"] = all(torch.isfinite(torch.tensor(v)) for v in metrics.values()) and metrics["grad_norm"] > 0
    return out


def _check_replay(r: dict) -> None:
    b, s = r["ids_shape"]
    assert r["engine_records"] and r["replays"] == 2
    assert r["shape"] == (b, s, 2, 2)  # [B, P + R, MoE layers, top-k]
    assert r["match"] > 0.98, r["match"]  # the rollout's routing is the model's (KV-cache vs full forward)
    assert r["replay_vs_flipped"] > 1e-3  # the replayed choices decide the routing
    assert r["replays_cleared"] and r["update_ok"]
    print(f"\nR3: rollout routing == teacher-forced routing on {r['match']:.4f} of the tokens")
