"""Generation replicas at PP > 1: each TP group holds the whole model, refilled bit-exactly from the
pipeline stages through the WeightExporter stream; ``data.num_rollout_workers`` is checked against N/t
(at config load, before any process starts, and again where each engine starts), derived when absent."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.dist_utils import run_distributed


def _replica_worker(rank, world_size):
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu

    from tests.layout.test_pp_equivalence import _local_weights
    from verl_bridge.bridge import MegatronBridge
    from verl_bridge.config import load_config
    from verl_bridge.rollout.replica import start_replicas

    cfg = load_config("templates/quickstart.yaml", ["trainer.args.tp_size=2", "trainer.args.pp_size=2",
                                                    "trainer.args.sequence_parallel=true", "trainer.output_dir=null",
                                                    "model.actor.args.num_layers=4"], world_size=world_size)
    bridge = MegatronBridge.from_config(cfg)
    layout = bridge.initialize()
    actor = bridge.actor_builder()()
    engine = start_replicas(bridge, actor, layout, cfg, is_logger=False)  # default: megatron's swap on >= 0.16
    fallback = start_replicas(bridge, actor, layout, cfg, is_logger=False, refill="exporter")
    # change the training weights (an optimizer step would), then refill; the same generator on every rank
    # keeps the TP-replicated weights (norms, row-parallel biases) equal across TP ranks, as training does
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in actor.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    engine.sync_weights()
    fallback.sync_weights()
    stages: list = [None] * layout.pp_size
    dist.all_gather_object(stages, _local_weights(actor), group=mpu.get_pipeline_model_parallel_group())
    training = {k: v for s in stages for k, v in s.items()}
    replica = {k: v for k, v in engine.replica.state_dict().items() if not k.endswith("_extra_state")}
    other = {k: v for k, v in fallback.replica.state_dict().items() if not k.endswith("_extra_state")}
    layers = sorted({k.split(".")[2] for k in replica if k.startswith("decoder.layers.")})
    same = all(torch.equal(replica[k], training[k]) for k in replica)
    out = {"layers": layers, "missing": sorted(set(replica) ^ set(training)), "bit_identical": same,
           "sp_off": not engine.replica.config.sequence_parallel, "refill": (engine.refill, fallback.refill),
           "swap_equals_exporter": set(replica) == set(other) and all(torch.equal(replica[k], other[k]) for k in replica)}
    # the sync probe checks every replica against the pipelined training forward
    from verl_bridge.rollout.verify import SyncVerificationError
    from verl_bridge.runtime.experience import sequence_log_probs

    def trainer_lp(ids):
        return sequence_log_probs(actor, ids, pp_size=layout.pp_size)

    out["probe_diffs"] = [r.max_abs_diff for r in engine.verify(trainer_lp, threshold=1e-3)]
    if engine.index == 1:  # corrupt replica 1 only (ranks 2 and 3): the probe must name it on every rank
        with torch.no_grad():
            engine.replica.state_dict()["decoder.layers.2.mlp.linear_fc2.weight"].mul_(3.0)
    try:
        engine.verify(trainer_lp, threshold=1e-3)
        out["corrupt"] = None
    except SyncVerificationError as exc:
        out["corrupt"] = str(exc)
    engine.sync_weights()  # the next refill repairs it
    out["repaired"] = len(engine.verify(trainer_lp, threshold=1e-3))
    return out


@pytest.mark.slow
def test_replica_refill_is_bit_identical_to_the_pipeline():
    """Both refills (megatron's swap_model_weights, the WeightExporter fallback) give bit-identical
    replicas equal to the training stages; the sync probe checks every replica and names a bad one."""
    runs = run_distributed(_replica_worker, 4)
    for r in runs:
        assert r["layers"] == ["0", "1", "2", "3"]  # the whole model on every rank (its TP shard)
        assert r["missing"] == [] and r["bit_identical"] and r["sp_off"]
        assert r["refill"] == ("swap_model_weights", "exporter") and r["swap_equals_exporter"]
        assert len(r["probe_diffs"]) == 2 and max(r["probe_diffs"]) <= 1e-4, r["probe_diffs"]
        assert r["corrupt"] is not None and r["corrupt"].startswith("generation replica(s) 1 (max |diff|"), r["corrupt"]
        assert "of 2 failed the sync probe after the swap_model_weights refill" in r["corrupt"]
        assert r["repaired"] == 2
    print("replica probe |replica - pipelined trainer| per replica:", runs[0]["probe_diffs"])


def test_num_rollout_workers_checked_against_replicas():
    from verl_bridge.rollout.replica import start_replicas

    layout = SimpleNamespace(world_size=4, tp_size=2, pp_size=2)
    cfg = SimpleNamespace(data=SimpleNamespace(num_rollout_workers=3))
    with pytest.raises(ValueError, match=r"num_rollout_workers=3.*gives 2 generation replicas.*set it to 2"):
        start_replicas(None, None, layout, cfg, is_logger=False)


def test_num_rollout_workers_derived_and_validated_at_load():
    """The article's meaning, for every layout: N / t workers, t = training TP (native) or
    rollout.tp_size (vLLM); refused before torchrun with the arithmetic, derived when absent."""
    from verl_bridge.config import ConfigError, load_config
    from verl_bridge.config.derived import rollout_tp_size, rollout_worker_lines, rollout_workers

    base = ["trainer.output_dir=null", "trainer.args.tp_size=2", "algorithm.micro_batch_size=8"]
    cfg = load_config("templates/quickstart.yaml", base + ["trainer.args.pp_size=2"], world_size=4)
    assert cfg.data.num_rollout_workers is None  # absent: derived
    assert rollout_workers(4, rollout_tp_size(cfg)) == 2
    assert rollout_worker_lines(4, 2) == ["Rollout worker 0 started on ranks 0 & 1 (TP group)",
                                          "Rollout worker 1 started on ranks 2 & 3 (TP group)"]
    assert rollout_worker_lines(2, 1) == ["Rollout worker 0 started on rank 0", "Rollout worker 1 started on rank 1"]
    load_config("templates/quickstart.yaml", base + ["data.num_rollout_workers=2"], world_size=4)  # PP=1, DP=2
    with pytest.raises(ConfigError) as e:
        load_config("templates/quickstart.yaml", base + ["trainer.args.pp_size=2", "data.num_rollout_workers=4"],
                    world_size=4)
    assert ("data.num_rollout_workers=4: world size 4 / trainer.args.tp_size 2 gives 2 generation replicas"
            in str(e.value)), str(e.value)
    # vLLM: the same key and rule, t = rollout.tp_size
    vllm = base + ["rollout.engine=vllm", "rollout.tp_size=1"]
    cfg = load_config("templates/quickstart.yaml", vllm + ["data.num_rollout_workers=4"], world_size=4,
                      check_paths=False)
    assert rollout_tp_size(cfg) == 1
    with pytest.raises(ConfigError, match=r"num_rollout_workers=2: world size 4 / rollout.tp_size 1 gives 4"):
        load_config("templates/quickstart.yaml", vllm + ["data.num_rollout_workers=2"], world_size=4,
                    check_paths=False)


def test_vllm_engine_checks_rollout_workers():
    """``build_vllm_engine``'s check (a config built without validation), the config-load rule again."""
    from verl_bridge.config import load_config
    from verl_bridge.rollout.vllm_engine import check_vllm_rollout_workers

    cfg = load_config("templates/quickstart.yaml", ["trainer.output_dir=null", "rollout.engine=vllm"],
                      check_paths=False)
    layout = SimpleNamespace(world_size=4, tp_size=2, pp_size=1, dp_size=2)
    assert check_vllm_rollout_workers(cfg, layout) == (2, 2)  # derived: rollout TP = training TP
    cfg.rollout.tp_size = 1
    assert check_vllm_rollout_workers(cfg, layout) == (4, 1)
    cfg.data.num_rollout_workers = 2
    with pytest.raises(ValueError, match=r"world size 4 / rollout.tp_size 1 gives 4 generation replicas.*set it to 4"):
        check_vllm_rollout_workers(cfg, layout)
