"""Resharding: stream a TP/PP-sharded megatron-core model's weights as full, HF-named tensors.

    from verl_bridge.resharding import WeightExporter
    exp = WeightExporter(model, bucket_bytes=cfg.rollout.bucket_mb << 20, vocab_size=hf_vocab)
    for bucket in exp.iter_buckets():      # every rank of the TP x PP world, together
        engine.load_weights(bucket)
    exp.stats.gbps, exp.stats.peak_extra_bytes
"""

from verl_bridge.resharding.export import ExportStats, WeightExporter, local_spec_name  # noqa: F401
