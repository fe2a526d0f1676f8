"""The plan against real megatron models at TP=2 (one 2-process run): per-rank parameter counts
(TP sharding of weights, biases, norms, learned positions, padded vocabulary), and the refit plan
against the streaming exporter (verl_bridge.resharding.WeightExporter): bytes, tensor and bucket
counts equal, the measured peak within the planned bound."""

from tests.dist_utils import run_distributed

BUCKETS = (1000, 4096, 9000, 40000)


def _export(rank, world_size, dirs):
    import json

    from verl_bridge.arch import hf_model_provider
    from verl_bridge.distributed import init_model_parallel
    from verl_bridge.resharding import WeightExporter

    init_model_parallel(world_size, 1)
    out = {}
    for arch, hf_dir in dirs.items():
        model = hf_model_provider(hf_dir)()
        out[arch] = sum(p.numel() for p in model.parameters())
        with open(f"{hf_dir}/config.json") as f:
            vocab = json.load(f)["vocab_size"]
        for b in BUCKETS:
            exp = WeightExporter(model, bucket_bytes=b, vocab_size=vocab)
            for _ in exp.iter_buckets():
                pass
            s = exp.stats
            out[arch, b] = (s.bytes, s.tensors, s.buckets, s.peak_extra_bytes)
    return out


def test_plan_matches_megatron_and_the_exporter_at_tp2(tmp_path):
    from tests.arch.tiny_hf import make_config, make_tiny_hf

    from verl_bridge.planning.memory import stage_params_per_rank
    from verl_bridge.planning.refit import plan_refit
    from verl_bridge.planning.shapes import shape_from_hf_config

    archs = ("llama", "qwen2", "opt")
    for arch in archs:
        make_tiny_hf(arch, tmp_path / arch)
    measured = run_distributed(_export, 2, {a: str(tmp_path / a) for a in archs})[0]
    for arch in archs:
        shape = shape_from_hf_config(make_config(arch).to_dict(), arch)
        assert measured[arch] == stage_params_per_rank(shape, 2, 1, 0), arch
        for b in BUCKETS:
            plan = plan_refit(shape, "fp32", b / 2 ** 20, tp=2)
            nbytes, tensors, buckets, peak = measured[arch, b]
            assert (plan.bytes_per_sync, plan.tensors, plan.buckets) == (nbytes, tensors, buckets), (arch, b)
            assert peak <= plan.peak_extra_bytes, (arch, b)
