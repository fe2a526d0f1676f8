"""Per-rank memory estimate of a config: pure arithmetic, no torch, no weights.

Formulas (P = parameters held by the rank, bytes per parameter in parentheses):

* parameters in ``trainer.precision`` (bf16/fp16: 2, fp32: 4). TP shards every linear weight,
  column-parallel biases and the vocabulary (padded to a multiple of 128 * TP, Megatron-LM's
  rule); norms, row-parallel biases and a learned position table are replicated. PP gives each
  stage ``num_layers / PP`` layers; the first stage holds the embeddings, the last the final norm
  and the output layer (with tied embeddings and PP > 1 the last stage keeps its own copy).
* gradients: fp32 main grads (4), Megatron's DDP default with bf16 (``accumulate_allreduce_grads_in_fp32``).
* optimizer: Adam m + v in fp32 (8) plus an fp32 master copy for bf16/fp16 (4); divided by DP with
  ``trainer.args.use_distributed_optimizer`` (Megatron's distributed optimizer: 6 + 12/DP bytes/param
  in bf16, 18 without).
* reference: parameters only, sharded like the actor; 0 on the device with ``model.reference.args.offload``.
* critic: ``megatron`` = the actor's shape with a scalar value head instead of the output layer,
  trained like the actor; ``huggingface`` = the full model replicated on every rank, optimizer not sharded.
* rollout KV cache: 2 (K and V) * layers/PP * kv_heads/TP * head_dim * bytes * samples per DP rank
  (``rollout_batch_size * group_size / DP``) * (``max_prompt_length + max_response_length``).
* training activations per micro-batch and layer (Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", 16-bit activations, no recomputation), s = sequence,
  b = micro-batch, h = hidden, a = heads, t = TP:
  no TP ``s*b*h*(34 + 5*a*s/h)``; TP ``s*b*h*(10 + 24/t + 5*a*s/(h*t))``; TP + SP ``s*b*h*(34 + 5*a*s/h)/t``.
  ``use_flash_attn`` drops the ``5*a*s/h`` term (no s x s scores stored). A stage holds
  ``min(PP - stage, micro-batches)`` micro-batches in flight (1F1B); the last stage adds the fp32
  logits ``s*b*V/t*4``.

* generation replica (the rollout workers, :mod:`verl_bridge.rollout.replica`, ``data.num_rollout_workers``
  = N / t): with the native engine at PP > 1 each rank also holds the **whole** model (all layers,
  embeddings and output layer) at TP=t in ``trainer.precision``, ``stage_params_per_rank(tp, pp=1)``.
  It is **kept** between rollouts (static memory, the role ``replica``): it is refilled in place every step, and freeing
  it would mean a model build and a fresh allocation of the same size every step for memory that
  the training phase's peak mostly does not need (it is the actor's parameters once, at TP=t, next
  to parameters + gradients + optimizer states of 18 bytes per parameter). At PP=1 the training
  actor is the replica: nothing extra. With vLLM the engine's own weights (the whole model at
  ``rollout.tp_size``) are **freed** between rollouts on CUDA (sleep level 2, with its KV cache), so
  they count in the rollout phase only; vLLM's CPU worker has no sleep mode and keeps them.

Rollout and training do not overlap in time (the KV cache is freed before the update), so a
rank's peak is its static memory (parameters, gradients, optimizer states of every role, a kept
generation replica) plus the larger of its rollout memory (KV cache, and vLLM's weights) and its
training activations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from verl_bridge.planning.shapes import ModelShape, padded_vocab

GiB = 1024 ** 3
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def fmt_gib(n: float) -> str:
    """GiB with two decimals; MiB or KiB for what would print as 0.00 GiB (tiny models)."""
    if n >= 0.01 * GiB or n == 0:
        return f"{n / GiB:.2f} GiB"
    if n >= 0.01 * 1024 ** 2:
        return f"{n / 1024 ** 2:.2f} MiB"
    return f"{n / 1024:.2f} KiB"


def fmt_count(n: int) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.3f} {unit}"
    return str(n)


@dataclass
class Layout:
    world: int
    tp: int
    pp: int
    dp: int
    sp: bool
    distributed_optimizer: bool
    ep: int = 1  # expert parallelism (MoE): experts split over ep ranks of the data-parallel ranks


def layout_of(cfg, world: int) -> Layout:
    ta = cfg.trainer.args
    return Layout(world, ta.tp_size, ta.pp_size, world // (ta.tp_size * ta.pp_size), bool(ta.sequence_parallel),
                  bool(ta.use_distributed_optimizer), int(getattr(ta, "ep_size", 1) or 1))


def stage_layers(num_layers: int, pp: int, stage: int) -> int:
    base, extra = divmod(num_layers, pp)
    return base + (1 if stage < extra else 0)


def expert_params_per_rank(s: ModelShape, tp: int, ep: int = 1) -> int:
    """One MoE layer's routed-expert parameters on one rank: the E experts divided over EP, each
    expert's matrices over TP (megatron's default expert TP = TP)."""
    if not s.is_moe:
        return 0
    if s.num_experts % ep:
        raise ValueError(f"EP={ep} does not divide num_experts={s.num_experts}")
    f = s.moe_ffn_hidden_size
    return s.num_experts // ep * (3 * f * s.hidden_size // tp)


def layer_params_per_rank(s: ModelShape, tp: int, ep: int = 1) -> int:
    """One layer's parameters on one rank: attention and dense MLP over TP; experts over EP x TP;
    router and norms replicated."""
    h, hd = s.hidden_size, s.head_dim
    qkv = (s.num_attention_heads + 2 * s.num_query_groups) * hd
    up = s.ffn_hidden_size * (2 if s.gated_mlp else 1)
    n = h * qkv // tp + s.num_attention_heads * hd * h // tp
    if s.is_moe:
        n += expert_params_per_rank(s, tp, ep) + s.num_experts * h  # experts + router
        sf = s.shared_expert_ffn_hidden_size
        n += 3 * sf * h // tp + (h if s.shared_expert_gate else 0)
        up = 0
    else:
        n += h * up // tp + s.ffn_hidden_size * h // tp
    if s.qk_norm:
        n += 2 * hd
    if s.linear_bias or s.qkv_bias:
        n += qkv // tp  # column-parallel
    if s.linear_bias:
        n += up // tp + 2 * h  # fc1 bias column-parallel; o_proj and fc2 biases replicated
    n += 2 * h * (2 if s.norm_bias else 1)
    return n


def stage_params_per_rank(s: ModelShape, tp: int, pp: int, stage: int, value_head: bool = False, ep: int = 1) -> int:
    """Parameters held by one rank of pipeline stage ``stage`` (0-based); MoE experts divided over ``ep``."""
    h = s.hidden_size
    vocab = padded_vocab(s.vocab_size, tp, s.vocab_divisible_by)
    n = stage_layers(s.num_layers, pp, stage) * layer_params_per_rank(s, tp, ep)
    if stage == 0:
        n += vocab // tp * h
        if s.learned_positions:
            n += s.max_position_embeddings * h
    if stage == pp - 1:
        n += h * (2 if s.norm_bias else 1)
        if value_head:
            n += h + 1
        elif not s.tied_embeddings or pp > 1:
            n += vocab // tp * h
    return n


def total_params(s: ModelShape) -> int:
    """Parameters of the model as Hugging Face stores it (unpadded vocabulary, tied output once)."""
    from verl_bridge.planning.shapes import stream_entries

    return sum(sum(pieces) for _, _, pieces in stream_entries(s))


def activation_bytes_per_layer(s: ModelShape, seq: int, micro: int, tp: int, sp: bool, flash: bool) -> float:
    h, a = s.hidden_size, s.num_attention_heads
    attn = 0.0 if flash else 5 * a * seq / h
    if tp == 1:
        per = 34 + attn
    elif sp:
        per = (34 + attn) / tp
    else:
        per = 10 + 24 / tp + attn / tp
    return seq * micro * h * per


@dataclass
class RankEstimate:
    kind: str  # "pipeline stage 0 of 2" ...
    stage: int
    roles: dict[str, dict[str, float]] = field(default_factory=dict)  # role -> {params, grads, optimizer}
    kv_cache: float = 0.0
    activations: float = 0.0
    rollout_weights: float = 0.0  # the rollout engine's weights present during rollouts only (vLLM, freed after)
    replica: str = ""  # how the generation replica is held: "kept", "freed", or "" (the training actor is it)

    @property
    def static(self) -> float:
        return sum(sum(v.values()) for v in self.roles.values())

    @property
    def rollout(self) -> float:
        return self.kv_cache + self.rollout_weights

    @property
    def peak(self) -> float:
        return self.static + max(self.rollout, self.activations)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "stage": self.stage, "roles": self.roles, "kv_cache": self.kv_cache,
                "rollout_weights": self.rollout_weights, "generation_replica": self.replica or "training actor",
                "activations": self.activations, "static": self.static, "peak": self.peak}


@dataclass
class MemoryPlan:
    shape: ModelShape
    shape_source: str
    layout: Layout
    seq: int
    micro_batches: int
    ranks: list[RankEstimate]
    device_bytes: Optional[float]
    device_source: str
    warnings: list[str]
    notes: list[str]

    @property
    def worst(self) -> RankEstimate:
        return max(self.ranks, key=lambda r: r.peak)

    def to_dict(self) -> dict:
        lay = self.layout
        return {
            "model_shape": {**self.shape.to_dict(), "source": self.shape_source,
                            "total_params": total_params(self.shape)},
            "layout": {"world": lay.world, "tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "sequence_parallel": lay.sp,
                       "distributed_optimizer": lay.distributed_optimizer},
            "sequence_length": self.seq, "micro_batches_per_step": self.micro_batches,
            "ranks": [r.to_dict() for r in self.ranks],
            "device_memory": self.device_bytes, "device_memory_source": self.device_source,
            "fits": None if self.device_bytes is None else self.worst.peak <= self.device_bytes,
            "warnings": self.warnings, "notes": self.notes,
        }


def _trained(params: int, pbytes: int, dp: int, distributed: bool, sharded_optimizer: bool = True) -> dict:
    optim = params * (8 + (4 if pbytes < 4 else 0))
    if distributed and sharded_optimizer:
        optim /= dp
    return {"params": float(params * pbytes), "grads": float(params * 4), "optimizer": float(optim)}


def _estimate(cfg, shape: ModelShape, lay: Layout, seq: int, rollout_samples: int, sp: bool,
              ref_offload: bool) -> list[RankEstimate]:
    pbytes = DTYPE_BYTES.get(cfg.trainer.precision, 4)
    a, d = cfg.algorithm, cfg.data
    micro = a.micro_batch_size
    samples = d.rollout_batch_size * a.group_size
    mini = a.mini_batch_size or samples
    n_micro = max(1, (mini // max(lay.dp, 1)) // micro)
    flash = bool(cfg.model.actor.args.use_flash_attn)
    has_ref = cfg.model.reference is not None or a.kl.coef > 0 or a.kl.target is not None
    out = []
    for st in sorted({0, min(1, lay.pp - 1), lay.pp - 1}):  # first, middle (alike), last stage
        if lay.pp == 1:
            kind = "every rank (PP=1)"
        elif st == 0:
            kind = "PP stage 0 (first)"
        elif st == lay.pp - 1:
            kind = f"PP stage {st} (last)"
        else:
            kind = f"PP stages 1..{lay.pp - 2} (middle)"
        r = RankEstimate(kind=kind, stage=st)
        p = stage_params_per_rank(shape, lay.tp, lay.pp, st, ep=lay.ep)
        # experts: their optimizer state is sharded over the expert-data-parallel ranks (DP / EP)
        pe = stage_layers(shape.num_layers, lay.pp, st) * expert_params_per_rank(shape, lay.tp, lay.ep)
        dense = _trained(p - pe, pbytes, lay.dp, lay.distributed_optimizer)
        experts = _trained(pe, pbytes, max(lay.dp // lay.ep, 1), lay.distributed_optimizer)
        r.roles["actor"] = {k: dense[k] + experts[k] for k in dense}
        if has_ref:
            r.roles["reference"] = {"params": 0.0 if ref_offload else float(p * pbytes)}
        if cfg.model.critic is not None:
            if cfg.model.critic.type == "huggingface":
                pc = total_params(shape) - (0 if shape.tied_embeddings else shape.vocab_size * shape.hidden_size) \
                    + shape.hidden_size + 1
                r.roles["critic"] = _trained(pc, pbytes, lay.dp, lay.distributed_optimizer, sharded_optimizer=False)
            else:
                pc = stage_params_per_rank(shape, lay.tp, lay.pp, st, value_head=True)
                r.roles["critic"] = _trained(pc, pbytes, lay.dp, lay.distributed_optimizer)
        if cfg.rollout.engine == "vllm":  # vLLM's own copy of the whole model at rollout TP, asleep while training
            from verl_bridge.config.derived import rollout_tp_size

            r.rollout_weights = float(stage_params_per_rank(shape, rollout_tp_size(cfg), 1, 0) * pbytes)
            r.replica = "freed"
        elif lay.pp > 1:  # the whole model at TP=t next to the training stage, refilled in place every step
            r.roles["replica"] = {"params": float(stage_params_per_rank(shape, lay.tp, 1, 0) * pbytes)}
            r.replica = "kept"
        layers = stage_layers(shape.num_layers, lay.pp, st)
        kv_heads = max(shape.num_query_groups // lay.tp, 1)
        r.kv_cache = float(2 * layers * kv_heads * shape.head_dim * pbytes * rollout_samples * seq)
        in_flight = min(lay.pp - st, n_micro)
        act = layers * activation_bytes_per_layer(shape, seq, micro, lay.tp, sp and lay.tp > 1, flash) * in_flight
        if st == lay.pp - 1:
            act += seq * micro * padded_vocab(shape.vocab_size, lay.tp, shape.vocab_divisible_by) / lay.tp * 4
        r.activations = float(act)
        out.append(r)
    return out


def plan_memory(cfg, world: int, shape: ModelShape, shape_source: str, device_bytes: Optional[float] = None,
                device_source: str = "not given") -> MemoryPlan:
    lay = layout_of(cfg, world)
    d, a = cfg.data, cfg.algorithm
    seq = d.max_prompt_length + d.max_response_length
    rollout_samples = d.rollout_batch_size * a.group_size // max(lay.dp, 1)
    ref_offload = bool(cfg.model.reference is not None and cfg.model.reference.args.offload)
    ranks = _estimate(cfg, shape, lay, seq, rollout_samples, lay.sp, ref_offload)
    samples = d.rollout_batch_size * a.group_size
    n_micro = max(1, ((a.mini_batch_size or samples) // max(lay.dp, 1)) // a.micro_batch_size)
    warnings: list[str] = []
    notes: list[str] = []
    if seq > shape.max_position_embeddings:
        warnings.append(f"data.max_prompt_length + max_response_length = {seq} exceeds the model's "
                        f"max_position_embeddings {shape.max_position_embeddings}")
    if lay.dp > 1 and lay.distributed_optimizer:
        notes.append("optimizer state is divided by DP as Megatron's distributed optimizer does; this build's "
                     "TorchOptimizer does not shard it yet (verl_bridge/runtime/optimizer.py)")
    if shape.is_moe:
        pe = expert_params_per_rank(shape, lay.tp, lay.ep)
        notes.append(f"experts: {shape.num_experts} per layer (top-{shape.moe_topk}), {shape.num_experts // lay.ep} on "
                     f"each rank (EP={lay.ep}), {fmt_count(pe * shape.num_layers)} expert parameters per rank of "
                     f"{fmt_count(total_params(shape))} in all; attention and shared experts divided over TP={lay.tp}, "
                     "routers replicated; activations are counted as for a dense layer")
    if cfg.model.critic is not None and cfg.model.critic.type == "huggingface":
        notes.append("the Hugging Face critic is replicated on every rank (no TP/PP sharding, optimizer not sharded)")
    notes.append(replica_note(cfg, lay, ranks[0], world))
    plan = MemoryPlan(shape, shape_source, lay, seq, n_micro, ranks, device_bytes, device_source, warnings, notes)
    if device_bytes is not None and plan.worst.peak > device_bytes:
        warnings.extend(_remedies(cfg, plan, shape, ref_offload))
    return plan


def replica_note(cfg, lay: Layout, rank: RankEstimate, world: int) -> str:
    """Where the rollout workers' weights live, how much they cost, and whether they stay between rollouts."""
    from verl_bridge.config.derived import rollout_tp_size, rollout_workers

    t = rollout_tp_size(cfg)
    n = rollout_workers(lay.tp * lay.pp * lay.dp, t)
    head = f"rollout workers: {n} generation replica(s), each the whole model on {t} consecutive rank(s) (TP={t}); "
    if rank.replica == "freed":
        return (head + f"vLLM's weights {fmt_gib(rank.rollout_weights)}/rank are freed between rollouts with its KV "
                "cache (sleep level 2 on CUDA; counted in the rollout phase; vLLM's CPU worker keeps them)")
    if rank.replica == "kept":
        size = rank.roles["replica"]["params"]
        return (head + f"extra {fmt_gib(size)}/rank next to the training stage, kept between rollouts (refilled in "
                "place every step; freeing it would rebuild the model and reallocate as much every step, to save "
                "memory the training peak mostly does not need)")
    return head + "the training actor is the replica (PP=1): no extra memory"


def _remedies(cfg, plan: MemoryPlan, shape: ModelShape, ref_offload: bool) -> list[str]:
    """The seed article's advice for an OOM rollout, each with its number."""
    lay, dev, worst = plan.layout, plan.device_bytes, plan.worst
    d, a = cfg.data, cfg.algorithm
    out = [f"{worst.kind}: estimated peak {fmt_gib(worst.peak)} exceeds the device memory {fmt_gib(dev)} "
           f"({plan.device_source})"]
    # 1. a smaller rollout batch per TP x PP group (= per DP rank)
    now = max(d.rollout_batch_size * a.group_size // lay.dp, 1)
    if any(dev <= r.static + r.rollout_weights for r in plan.ranks):
        out.append(f"parameters, gradients and optimizer states alone need {fmt_gib(worst.static)} per rank: "
                   "no rollout batch fits; raise TP/PP, or DP with the distributed optimizer")
    else:
        # KV cache is linear in the samples per rank: samples that fit next to each rank's static memory
        fit = min(int((dev - r.static - r.rollout_weights) // (r.kv_cache / now)) for r in plan.ranks if r.kv_cache > 0)
        out.append(f"rollout KV cache: at most {fit} samples per TPxPP group fit (now {now}); use "
                   f"data.rollout_batch_size <= {fit * lay.dp // a.group_size} "
                   f"(group_size {a.group_size}, DP {lay.dp})")
        # 2. a shorter sequence (max_position_embeddings)
        seq = plan.seq
        lo, hi = 0, seq
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if _peak_at(cfg, shape, lay, mid, ref_offload) <= dev:
                lo = mid
            else:
                hi = mid - 1
        if lo < seq:
            out.append(f"sequence length: max_prompt_length + max_response_length <= {lo} fits at this batch "
                       f"(now {seq}); lower data.max_prompt_length / data.max_response_length (a shorter "
                       f"max_position_embeddings)")
    # 3. sequence parallelism
    if lay.tp > 1 and not lay.sp:
        with_sp = _estimate(cfg, shape, lay, plan.seq, d.rollout_batch_size * a.group_size // lay.dp, True,
                            ref_offload)
        saved = max(r.activations for r in plan.ranks) - max(r.activations for r in with_sp)
        out.append(f"trainer.args.sequence_parallel: true saves {fmt_gib(saved)} of activations per rank")
    elif lay.tp == 1:
        out.append("sequence parallelism needs tp_size > 1; raise trainer.args.tp_size to shard activations")
    # 4. offload the reference
    ref = worst.roles.get("reference", {}).get("params", 0.0)
    if ref > 0:
        out.append(f"model.reference.args.offload: true saves {fmt_gib(ref)} per rank (reference weights on CPU "
                   "between uses)")
    return out


def _peak_at(cfg, shape, lay, seq, ref_offload) -> float:
    d, a = cfg.data, cfg.algorithm
    ranks = _estimate(cfg, shape, lay, seq, d.rollout_batch_size * a.group_size // lay.dp, lay.sp, ref_offload)
    return max(r.peak for r in ranks)


def memory_table(plan: MemoryPlan) -> list[str]:
    """Console lines: one block per rank kind, one row per role."""
    lay = plan.layout
    lines = [f"model shape     {plan.shape.name}: {plan.shape.num_layers} layers, hidden {plan.shape.hidden_size}, "
             f"{plan.shape.num_attention_heads} heads ({plan.shape.num_query_groups} kv), ffn "
             f"{plan.shape.ffn_hidden_size}, vocab {plan.shape.vocab_size}, max pos "
             f"{plan.shape.max_position_embeddings}; {fmt_count(total_params(plan.shape))} params "
             f"(from {plan.shape_source})",
             f"memory/rank     TP={lay.tp} PP={lay.pp} DP={lay.dp}{' EP=%d' % lay.ep if lay.ep > 1 else ''} "
             f"SP={lay.sp} distributed optimizer="
             f"{lay.distributed_optimizer}; sequence {plan.seq}, {plan.micro_batches} micro-batch(es) per step"]
    for r in plan.ranks:
        lines.append(f"  {r.kind}:")
        for role, parts in r.roles.items():
            detail = ", ".join(f"{k} {fmt_gib(v)}" for k, v in parts.items())
            what = f"; the generation replica at TP={lay.tp}, kept between rollouts" if role == "replica" else ""
            lines.append(f"    {role:<11} {fmt_gib(sum(parts.values())):>10}  ({detail}{what})")
        lines.append(f"    {'kv cache':<11} {fmt_gib(r.kv_cache):>10}  (rollout)")
        if r.rollout_weights:
            lines.append(f"    {'vllm weights':<11} {fmt_gib(r.rollout_weights):>10}  (rollout; freed between rollouts)")
        lines.append(f"    {'activations':<11} {fmt_gib(r.activations):>10}  (training, in-flight micro-batches)")
        verdict = ""
        if plan.device_bytes is not None:
            fits = "fits" if r.peak <= plan.device_bytes else "DOES NOT FIT"
            verdict = f"  of {fmt_gib(plan.device_bytes)}: {fits}"
        lines.append(f"    {'peak':<11} {fmt_gib(r.peak):>10}  (static + max(rollout, activations)){verdict}")
    return lines
