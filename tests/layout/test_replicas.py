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
    engine = start_replicas(bridge, actor, layout, cfg, is_logger=False)
    # change the training weights (an optimizer step would), then refill
    with torch.no_grad():
        for p in actor.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    engine.sync_weights()
    stages: list = [None] * layout.pp_size
    dist.all_gather_object(stages, _local_weights(actor), group=mpu.get_pipeline_model_parallel_group())
    training = {k: v for s in stages for k, v in s.items()}
    replica = {k: v for k, v in engine.replica.state_dict().items() if not k.endswith("_extra_state")}
    layers = sorted({k.split(".")[2] for k in replica if k.startswith("decoder.layers.")})
    same = all(torch.equal(replica[k], training[k]) for k in replica)
    return {"layers": layers, "missing": sorted(set(replica) ^ set(training)), "bit_identical": same,
            "sp_off": not engine.replica.config.sequence_parallel}


@pytest.mark.slow
def test_replica_refill_is_bit_identical_to_the_pipeline():
    for r in run_distributed(_replica_worker, 4):
        assert r["layers"] == ["0", "1", "2", "3"]  # the whole model on every rank (its TP shard)
        assert r["missing"] == [] and r["bit_identical"] and r["sp_off"]


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


def test_vllm_engine_checks_rollout_workers_before_starting_vllm():
    """``build_vllm_engine``'s check runs before vLLM is imported (a config built without validation)."""
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
