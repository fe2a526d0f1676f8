"""Rollout workers at PP > 1: generation replicas resharded from the training layout (3D-HybridEngine idea).

With training TP=t x PP=p over N = t*p ranks (DP=1), there are N/t generation replicas. Replica
``r`` lives on the ``t`` consecutive ranks of training TP group ``r`` and holds the **whole**
model (pipeline stages merged) at TP=t: each rank keeps its own TP shard of every layer. Every
step:

1. :meth:`ReplicaEngine.sync_weights` refills every replica from the training model. The stream is
   :class:`verl_bridge.resharding.WeightExporter` (every rank of the TP x PP world receives every
   full, HF-named tensor; each rank copies its TP shard of each into its replica:
   :func:`refill_from_exporter`). Bit-exact: the stream and the TP split are copies.
   (megatron-core >= 0.16 also ships ``megatron.core.resharding.swap_model_weights``; it needs both
   models built with their own ``pg_collection``, which a provider that reads megatron's globals
   does not give, so it is not used yet.)
2. :meth:`ReplicaEngine.generate`: replica ``r`` generates its share of the step's prompts (a
   contiguous ``1/n`` slice, seed ``seed + r``) with the native engine; the shares are gathered
   over the pipeline group (one rank of each replica, the same TP rank) and merged in replica
   order, so every training rank holds the identical batch the trainer needs.

Memory: the replica is a second full copy of the actor's parameters per TP shard (the training
stage holds 1/p of them), kept between rollouts: rebuilding it each step would cost a model build;
freeing it is a possible later option. Sequence parallelism is switched off on the replica
(megatron's ``set_model_to_sequence_parallel``): decoding one token cannot be split over TP.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from verl_bridge.rollout.base import RolloutBatch, SamplingParams


@contextlib.contextmanager
def pipeline_merged():
    """megatron's parallel state reads pipeline size 1 / rank 0 inside (its public setters), so a
    provider builds every layer with pre- and post-processing; restored after."""
    from megatron.core import parallel_state as mpu

    size, rank = mpu.get_pipeline_model_parallel_world_size(), mpu.get_pipeline_model_parallel_rank()
    mpu.set_pipeline_model_parallel_world_size(1)
    mpu.set_pipeline_model_parallel_rank(0)
    try:
        yield
    finally:
        mpu.set_pipeline_model_parallel_world_size(None)
        mpu.set_pipeline_model_parallel_rank(None)
        if (mpu.get_pipeline_model_parallel_world_size(), mpu.get_pipeline_model_parallel_rank()) != (size, rank):
            mpu.set_pipeline_model_parallel_world_size(size)  # they had been set explicitly before
            mpu.set_pipeline_model_parallel_rank(rank)


def build_generation_replica(build) -> torch.nn.Module:
    """The whole model at this rank's TP shard (``build``: the bridge's builder for a merged pipeline)."""
    from megatron.core.transformer.utils import set_model_to_sequence_parallel

    from verl_bridge.compat import unwrap_model

    with pipeline_merged():
        model = build()
    inner = unwrap_model(model)
    if getattr(inner.config, "sequence_parallel", False):
        set_model_to_sequence_parallel(inner, set_to=False)
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval()


@torch.no_grad()
def refill_from_exporter(exporter, replica: torch.nn.Module) -> int:
    """Copy this rank's TP shard of every streamed full tensor into ``replica``; returns how many
    parameters were written (all of them, or it raises naming the one it could not fill)."""
    from megatron.core import parallel_state as mpu

    from verl_bridge.arch.convert import ModelDims, hf_to_mcore, shard_for_tp
    from verl_bridge.compat import unwrap_model

    full = {name: t.clone() for name, t in exporter.iter_tensors()}
    inner = unwrap_model(replica)
    tp_size, tp_rank = mpu.get_tensor_model_parallel_world_size(), mpu.get_tensor_model_parallel_rank()
    dims = ModelDims(**{**exporter.dims.__dict__, "padded_vocab_size": getattr(inner, "vocab_size", None)})
    extras = dict(exporter.hf_extras or {})
    n = 0
    for name, tensor in inner.state_dict(keep_vars=True).items():
        if name.endswith("._extra_state") or tensor is None:
            continue
        source = "embedding.word_embeddings.weight" if name == "output_layer.weight" and dims.tie_embeddings else name
        value = hf_to_mcore(source, full, exporter.spec, dims, extras=extras)
        shard = shard_for_tp(source, value, tp_size, tp_rank, dims)
        if tuple(shard.shape) != tuple(tensor.shape):
            raise ValueError(f"generation replica: {name} gets shape {tuple(shard.shape)}, holds {tuple(tensor.shape)}")
        tensor.copy_(shard.to(tensor.dtype))
        n += 1
    return n


def merge_batches(parts: list[RolloutBatch], pad_id: int) -> RolloutBatch:
    """Concatenate rollout batches row-wise: prompts re-left-padded, responses re-right-padded."""
    P = max(b.prompt_ids.shape[1] for b in parts)
    R = max(b.response_ids.shape[1] for b in parts)

    def left(t, width, fill):
        return torch.nn.functional.pad(t, (width - t.shape[1], 0), value=fill)

    def right(t, width, fill):
        return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=fill)

    lp = None
    if all(b.log_probs is not None for b in parts):
        lp = torch.cat([right(b.log_probs, R, 0.0) for b in parts])
    return RolloutBatch(prompt_ids=torch.cat([left(b.prompt_ids, P, pad_id) for b in parts]),
                        prompt_mask=torch.cat([left(b.prompt_mask, P, 0) for b in parts]),
                        response_ids=torch.cat([right(b.response_ids, R, pad_id) for b in parts]),
                        response_mask=torch.cat([right(b.response_mask, R, 0) for b in parts]),
                        log_probs=lp)


class ReplicaEngine:
    """The native engine on a generation replica; the rollout engine of a PP > 1 training layout."""

    def __init__(self, actor: torch.nn.Module, replica: torch.nn.Module, device: torch.device, **native_kwargs):
        from megatron.core import parallel_state as mpu

        from verl_bridge.resharding import WeightExporter
        from verl_bridge.rollout.native import NativeEngine

        self.actor = actor
        self.replica = replica
        self.native = NativeEngine(replica, device, **native_kwargs)
        self.path, self.fast_reason, self.fast = self.native.path, self.native.fast_reason, None
        self.exporter = WeightExporter(actor)
        self.group = mpu.get_pipeline_model_parallel_group()  # one rank of each replica, same TP rank
        self.num_replicas = mpu.get_pipeline_model_parallel_world_size()
        self.index = mpu.get_pipeline_model_parallel_rank()  # replica = training TP group = PP index
        self.sync_weights()

    @property
    def model(self) -> torch.nn.Module:
        return self.replica

    def sync_weights(self) -> None:
        refill_from_exporter(self.exporter, self.replica)

    def probe_log_probs(self, input_ids, vocab_size, decode_steps: int = 3):
        return self.native.probe_log_probs(input_ids, vocab_size, decode_steps)

    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int) -> RolloutBatch:
        n = self.num_replicas
        bounds = [len(prompts) * i // n for i in range(n + 1)]
        mine = prompts[bounds[self.index]:bounds[self.index + 1]]
        out = self.native.generate(mine, params, seed + self.index) if mine else None
        shares: list = [None] * n
        dist.all_gather_object(shares, out, group=self.group)
        return merge_batches([s for s in shares if s is not None], params.pad_token_id)


def actor_world_size(layout) -> int:
    """N: the actor's ranks (TP x PP x DP; a separate reward group's ranks are not rollout workers)."""
    dp = getattr(layout, "dp_size", None)
    return layout.tp_size * layout.pp_size * dp if dp else layout.world_size


def num_rollout_workers(layout) -> int:
    """Generation replicas of a training layout: N / t with rollout TP t = training TP."""
    from verl_bridge.config.derived import rollout_workers

    return rollout_workers(actor_world_size(layout), layout.tp_size)


def check_rollout_workers(asked, world_size: int, rollout_tp: int, key: str = "trainer.args.tp_size") -> int:
    """``data.num_rollout_workers`` against N / t (None: derived); returns N / t or raises ValueError."""
    from verl_bridge.config.derived import rollout_workers, rollout_workers_problem

    problem = rollout_workers_problem(asked, world_size, rollout_tp, key=key)
    if problem:
        raise ValueError(problem)
    return rollout_workers(world_size, rollout_tp)


def log_rollout_workers(world_size: int, rollout_tp: int) -> None:
    """``[INFO] Rollout worker 0 started on ranks 0 & 1 (TP group)``, one line per worker (rank 0 calls it)."""
    from verl_bridge.config.derived import rollout_worker_lines
    from verl_bridge.runtime.metrics import info

    for line in rollout_worker_lines(world_size, rollout_tp):
        info(line)


def start_replicas(bridge, actor: torch.nn.Module, layout, cfg, is_logger: bool) -> ReplicaEngine:
    """Build this rank's generation replica and its engine; log the rollout workers the article's way.

    ``data.num_rollout_workers`` must equal N / t, or be absent (derived)."""
    from verl_bridge.runtime.metrics import info

    n = check_rollout_workers(cfg.data.num_rollout_workers, actor_world_size(layout), layout.tp_size)
    replica = build_generation_replica(bridge.actor_builder(whole_model=True))
    engine = ReplicaEngine(actor, replica, layout.device, compile=cfg.rollout.compile_decode, decode=cfg.rollout.decode)
    if is_logger:
        log_rollout_workers(actor_world_size(layout), layout.tp_size)
        info(f"rollout: native engine on {n} generation replicas (whole model at TP={layout.tp_size}, refilled from "
             f"the pipeline every step), {engine.path} decode path")
    return engine
