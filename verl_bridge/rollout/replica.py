"""Rollout workers at PP > 1: generation replicas resharded from the training layout (3D-HybridEngine idea).

With training TP=t x PP=p over N = t*p ranks (DP=1), there are N/t generation replicas. Replica
``r`` lives on the ``t`` consecutive ranks of training TP group ``r`` and holds the **whole**
model (pipeline stages merged) at TP=t: each rank keeps its own TP shard of every layer. Every
step:

1. :meth:`ReplicaEngine.sync_weights` refills every replica from the training model, one of two
   ways (:func:`default_refill_method`, by the installed megatron-core version):

   * ``"swap_model_weights"`` (megatron-core >= 0.16, ``REFILL_BY_SWAP_SINCE``): megatron's own
     ``megatron.core.resharding.swap_model_weights(actor, replica, ...)`` plans the copy from the
     two models' ``pg_collection`` and parameter names (global layer numbers: the pipeline stages
     map onto the merged replica by name, TP slices by megatron's ``partition_dim`` /
     ``partition_stride``) and sends each slice from the rank that owns it. The plan is built once
     and cached on the replica. Transport: NCCL on CUDA, :mod:`verl_bridge.compat.refit`'s
     CPU ``CopyService`` over gloo otherwise.
   * ``"exporter"`` (older megatron-core, or asked for): the :class:`verl_bridge.resharding.WeightExporter`
     stream (every rank of the TP x PP world receives every full, HF-named tensor; each rank copies
     its TP shard of each into its replica: :func:`refill_from_exporter`).

   Both are copies, so both are bit-exact, and give bit-identical replicas (``tests/layout/test_replicas.py``).
2. :meth:`ReplicaEngine.generate`: replica ``r`` generates its share of the step's prompts (a
   contiguous ``1/n`` slice, seed ``seed + r``) with the native engine; the shares are gathered
   over the pipeline group (one rank of each replica, the same TP rank) and merged in replica
   order, so every training rank holds the identical batch the trainer needs.
3. :meth:`ReplicaEngine.verify` (``rollout.verify_sync``): **every** replica scores the probe
   batch through its generation path; each is compared with the training model's log-probs (its
   pipelined forward, computed by the caller), and the verdicts of all replicas are gathered, so
   every rank raises the same :class:`~verl_bridge.rollout.verify.SyncVerificationError` naming
   the replicas that failed.

Memory: the replica is a second full copy of the actor's parameters per TP shard (the training
stage holds 1/p of them), kept between rollouts: rebuilding it each step would cost a model build
and a fresh allocation of the same size; ``verl-bridge plan`` counts it (role ``replica``, static
memory; 1.23 GiB/rank for the seed's OPT-1.3B at TP=2 x PP=2 in bf16, next to a 31.55 GiB peak:
:mod:`verl_bridge.planning.memory`). Sequence parallelism is switched off on the replica
(megatron's ``set_model_to_sequence_parallel``): decoding one token cannot be split over TP.
"""

from __future__ import annotations

import contextlib
from typing import Optional

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


REFILL_BY_SWAP_SINCE = (0, 16)  # megatron.core.resharding.swap_model_weights (compat.mcore_versions.RESHARDING_SINCE)
REFILL_METHODS = ("swap_model_weights", "exporter")


def default_refill_method() -> str:
    """``"swap_model_weights"`` where megatron-core ships it (>= 0.16), else the ``"exporter"`` stream."""
    from verl_bridge.compat.mcore_versions import mcore_version

    return "swap_model_weights" if mcore_version() >= REFILL_BY_SWAP_SINCE else "exporter"


def refill_by_swap(actor: torch.nn.Module, replica: torch.nn.Module) -> None:
    """megatron-core's ``swap_model_weights(actor, replica, ...)``: NCCL on CUDA, gloo on the CPU."""
    from verl_bridge.compat import unwrap_model

    src, dst = unwrap_model(actor), unwrap_model(replica)
    if next(dst.parameters()).is_cuda:
        from megatron.core.resharding import swap_model_weights

        swap_model_weights(src, dst, "nccl")
    else:
        from verl_bridge.compat.refit import swap_model_weights_cpu

        swap_model_weights_cpu(src, dst)


class ReplicaEngine:
    """The native engine on a generation replica; the rollout engine of a PP > 1 training layout."""

    def __init__(self, actor: torch.nn.Module, replica: torch.nn.Module, device: torch.device,
                 refill: Optional[str] = None, **native_kwargs):
        from megatron.core import parallel_state as mpu

        from verl_bridge.rollout.native import NativeEngine

        self.actor = actor
        self.replica = replica
        self.native = NativeEngine(replica, device, **native_kwargs)
        self.path, self.fast_reason, self.fast = self.native.path, self.native.fast_reason, None
        self.refill = refill or default_refill_method()
        if self.refill not in REFILL_METHODS:
            raise ValueError(f"replica refill {self.refill!r}: expected one of {REFILL_METHODS}")
        self.exporter = None
        if self.refill == "exporter":
            from verl_bridge.resharding import WeightExporter

            self.exporter = WeightExporter(actor)
        self.group = mpu.get_pipeline_model_parallel_group()  # one rank of each replica, same TP rank
        self.num_replicas = mpu.get_pipeline_model_parallel_world_size()
        self.index = mpu.get_pipeline_model_parallel_rank()  # replica = training TP group = PP index
        self.sync_weights()

    @property
    def model(self) -> torch.nn.Module:
        return self.replica

    def sync_weights(self) -> None:
        if self.refill == "swap_model_weights":
            refill_by_swap(self.actor, self.replica)
        else:
            refill_from_exporter(self.exporter, self.replica)

    def probe_log_probs(self, input_ids, vocab_size, decode_steps: int = 3):
        return self.native.probe_log_probs(input_ids, vocab_size, decode_steps)

    def verify(self, trainer_log_probs, *, threshold: float, vocab_size: Optional[int] = None):
        """The sync probe on **every** replica (collective over the world: every rank calls it).

        ``trainer_log_probs(ids) -> [B, S-1]``: the training model's next-token log-probs of the
        probe batch (its pipelined forward; the same on every rank). Each replica scores the probe
        through its generation path; the reports of all replicas are gathered and every rank raises
        the same ``SyncVerificationError`` naming each replica that failed. Returns the reports by
        replica."""
        from verl_bridge.compat import unwrap_model
        from verl_bridge.rollout.verify import SyncVerificationError, probe_input_ids, verify_sync

        inner = unwrap_model(self.replica)
        vocab = vocab_size or getattr(inner, "hf_vocab_size", None) or getattr(inner, "vocab_size", None)
        ids = probe_input_ids(vocab)
        trainer = trainer_log_probs(ids)
        engine = self.probe_log_probs(ids, vocab)
        try:
            report, error = verify_sync(trainer, engine, None, threshold=threshold), None
        except SyncVerificationError as exc:
            report, error = exc.report, str(exc)
        reports: list = [None] * dist.get_world_size()
        dist.all_gather_object(reports, (self.index, report, error))
        by_replica = {}
        for index, rep, err in reports:  # the TP ranks of one replica report alike; keep the worst
            if index not in by_replica or rep.max_abs_diff > by_replica[index][0].max_abs_diff:
                by_replica[index] = (rep, err)
        failed = {i: (rep, err) for i, (rep, err) in sorted(by_replica.items()) if err is not None}
        if failed:
            first = next(iter(failed.values()))
            names = ", ".join(f"{i} (max |diff| {rep.max_abs_diff:.3g})" for i, (rep, _) in failed.items())
            raise SyncVerificationError(f"generation replica(s) {names} of {len(by_replica)} failed the sync probe "
                                        f"after the {self.refill} refill: {first[1]}", first[0])
        return [by_replica[i][0] for i in sorted(by_replica)]

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
    from verl_bridge.common.log import info

    for line in rollout_worker_lines(world_size, rollout_tp):
        info(line)


def start_replicas(bridge, actor: torch.nn.Module, layout, cfg, is_logger: bool,
                   refill: Optional[str] = None) -> ReplicaEngine:
    """Build this rank's generation replica and its engine; log the rollout workers the article's way.

    ``data.num_rollout_workers`` must equal N / t, or be absent (derived)."""
    from verl_bridge.common.log import info

    n = check_rollout_workers(cfg.data.num_rollout_workers, actor_world_size(layout), layout.tp_size)
    replica = build_generation_replica(bridge.actor_builder(whole_model=True))
    engine = ReplicaEngine(actor, replica, layout.device, refill=refill, compile=cfg.rollout.compile_decode,
                           decode=cfg.rollout.decode, memory_fraction=cfg.rollout.gpu_memory_utilization)
    if is_logger:
        log_rollout_workers(actor_world_size(layout), layout.tp_size)
        how = ("megatron.core.resharding.swap_model_weights" if engine.refill == "swap_model_weights"
               else "the WeightExporter stream")
        info(f"rollout: native engine on {n} generation replicas (whole model at TP={layout.tp_size}, refilled from "
             f"the pipeline every step by {how}), {engine.path} decode path")
    return engine
