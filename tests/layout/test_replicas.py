"""Generation replicas at PP > 1: each TP group holds the whole model, refilled bit-exactly from the
pipeline stages through the WeightExporter stream; ``data.num_rollout_workers`` is checked against N/t."""

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
