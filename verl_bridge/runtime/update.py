"""The update: ``ppo_epochs`` x mini-batches x micro-batches for the actor, then the critic.

Each epoch shuffles this rank's samples (``torch.Generator`` seeded with ``trainer.seed + step``);
a mini-batch is ``algorithm.mini_batch_size / dp`` samples on each rank, split into micro-batches
of ``algorithm.micro_batch_size`` that megatron's schedule accumulates before one optimizer step
(gradient clipping inside the optimizer); with ``trainer.args.use_dynamic_bsz`` the micro-batches
hold up to ``trainer.args.max_tokens_per_micro_batch`` real tokens each, packed without padding
(:meth:`~verl_bridge.common.batch.Experience.token_micro_batches`), their count per rank varying. Losses:

* actor: the algorithm's policy loss (:data:`verl_bridge.algorithms.POLICY_LOSSES`; each token's
  term weighted by ``min(exp(old - rollout log-prob), cap)`` with ``algorithm.rollout_correction:
  {type: tis, cap}``), minus
  ``entropy_coef`` x entropy, plus ``kl.coef`` x KL when ``algorithm.kl.placement`` is ``loss``;
* critic: ``vf_coef`` x the clipped value loss.

Aggregation is over the whole mini-batch, as Megatron and verl do: every micro-batch's loss is its
share of the mini-batch loss (``algorithm.loss_agg_mode`` over a :class:`~verl_bridge.algorithms.GlobalBatch`
holding the mini-batch's token and sequence counts summed over the DP group), times
``n_micro * dp``, which undoes the schedule's mean over micro-batches and the optimizer's mean
over DP ranks: the gradient is that of one mean over every token of the mini-batch, however it is
split. The same scaled value is logged per micro-batch, so the mean over micro-batches and DP
ranks of ``actor_loss`` is the mini-batch loss.

An optimizer step that returns ``ok=False`` (inf/nan gradients) moved nothing: it is counted in
``skipped_steps`` and left out of ``grad_norm`` (0.0 when every step was skipped).
"""

from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist

from verl_bridge import algorithms as A
from verl_bridge.algorithms.registry import AlgorithmSpec
from verl_bridge.algorithms.rollout_correction import tis_weights
from verl_bridge.common.batch import Experience
from verl_bridge.runtime.forward import (forward_micro_batches, response_logits, response_token_log_probs,
                                         response_values)
from verl_bridge.runtime.logprobs import token_entropy, token_log_probs, unpadded_vocab_size
from verl_bridge.common.state import TrainerState


def actor_loss(mb: Experience, output: torch.Tensor, *, config, spec: AlgorithmSpec, kl_coef: float,
               global_batch=None, loss_scale: float = 1.0, vocab_size=None):
    """The actor's loss on micro-batch ``mb``: its share of the mini-batch loss (``global_batch``)
    times ``loss_scale``; ``vocab_size``: the unpadded vocabulary."""
    a = config.algorithm
    mask = mb.response_mask
    if a.entropy_coef > 0:  # the entropy needs the whole distribution: fp32 logits
        logits = response_logits(output, mb, config.rollout.temperature, vocab_size)
        lp = token_log_probs(logits, mb.response_ids)
    else:
        lp = response_token_log_probs(output, mb, config.rollout.temperature, vocab_size)
    low = a.clip_ratio_low if a.clip_ratio_low is not None else a.clip_ratio
    high = a.clip_ratio_high if a.clip_ratio_high is not None else a.clip_ratio
    extra, tis = {}, {}
    if a.rollout_correction is not None:  # truncated IS: the samples came from the rollout engine's policy
        w = rollout_correction_weights(mb, a.rollout_correction.cap)
        extra["token_weights"] = w
        tis = {"tis/weight_mean": float(A.masked_mean(w, mask)),
               "tis/capped_frac": float(A.masked_mean((w >= a.rollout_correction.cap).float(), mask))}
    pg_loss, st = A.POLICY_LOSSES[spec.policy_loss](lp, mb.tensors["old_log_probs"], mb.tensors["advantages"], mask,
                                                    clip_ratio_low=low, clip_ratio_high=high,
                                                    dual_clip_c=a.dual_clip_c, loss_agg_mode=a.loss_agg_mode,
                                                    global_batch=global_batch, **extra)
    loss = pg_loss
    if a.entropy_coef > 0:
        ent = token_entropy(logits)
        loss = loss - a.entropy_coef * A.aggregate_loss(ent, mask, a.loss_agg_mode, global_batch)
    if a.kl.placement == "loss" and "ref_log_probs" in mb.tensors and kl_coef > 0:
        kl = A.kl_penalty(lp, mb.tensors["ref_log_probs"], a.kl.estimator)
        loss = loss + kl_coef * A.aggregate_loss(kl, mask, a.loss_agg_mode, global_batch)
    loss, pg_loss = loss * loss_scale, pg_loss.detach() * loss_scale
    return loss, {"actor_loss": float(loss.detach()), "pg_loss": float(pg_loss), **st, **tis}


def rollout_correction_weights(mb: Experience, cap: float) -> torch.Tensor:
    """Per-token TIS weights ``min(exp(old - rollout), cap)`` of a micro-batch (needs the engine's log-probs)."""
    if "rollout_log_probs" not in mb.tensors:
        raise RuntimeError("algorithm.rollout_correction needs the rollout engine's log-probs of its samples, and "
                           "this engine returned none; remove algorithm.rollout_correction or use rollout.engine "
                           "native or vllm (both return them)")
    return tis_weights(mb.tensors["old_log_probs"], mb.tensors["rollout_log_probs"], cap)


def critic_loss(mb: Experience, output: torch.Tensor, *, config, global_batch=None, loss_scale: float = 1.0,
                vocab_size=None):
    """The critic's loss on ``mb`` (its share of the mini-batch loss times ``loss_scale``)."""
    a = config.algorithm
    v = response_values(output, mb)
    loss, st = A.value_loss(v, mb.tensors["values"], mb.tensors["returns"], mb.response_mask,
                            clip_range=a.value_clip, loss_agg_mode=a.loss_agg_mode, global_batch=global_batch)
    loss = a.vf_coef * loss * loss_scale
    return loss, {"critic_loss": float(loss.detach()), **st}


def max_tokens_per_micro_batch(config):
    """The token budget of a micro-batch when dynamic batching is on (``trainer.args.use_dynamic_bsz``), else None."""
    ta = config.trainer.args
    return ta.max_tokens_per_micro_batch if ta.use_dynamic_bsz else None


def global_batch(mask: torch.Tensor, dp_size: int, dp_group=None) -> A.GlobalBatch:
    """This mini-batch's token and sequence counts summed over the DP group (``dp_group``; None:
    the current one)."""
    gb = A.GlobalBatch.of(mask)
    if dp_size <= 1:
        return gb
    if dp_group is None:
        from verl_bridge.distributed import data_parallel_group

        dp_group = data_parallel_group()
    t = torch.tensor([gb.tokens, gb.sequences], dtype=torch.float64, device=mask.device)
    dist.all_reduce(t, group=dp_group)
    return A.GlobalBatch(float(t[0]), float(t[1]))


def update_model(model, optimizer, exp: Experience, loss_fn, *, config, dp_size: int, pp_size: int,
                 step: int, dp_group=None) -> dict[str, float]:
    """``ppo_epochs`` passes over ``exp`` in shuffled mini-batches; the mean of each stat, ``grad_norm``
    (mean over the steps taken) and ``skipped_steps``.

    ``loss_fn(mb, output, *, global_batch, loss_scale, vocab_size)``. The schedule runs
    ``optimizer.module``: the model itself, or megatron's DDP wrapper around it on CUDA.
    """
    a = config.algorithm
    mini = (a.mini_batch_size or exp.size * dp_size) // dp_size
    gen = torch.Generator().manual_seed(config.trainer.seed + step)
    sums: dict[str, float] = {}
    count = 0
    grad_norms = []
    skipped = 0
    module = getattr(optimizer, "module", model)
    vocab = unpadded_vocab_size(model)
    model.train()
    module.train()
    from verl_bridge.runtime.moe import moe_metrics_for

    moe = moe_metrics_for(model)  # moe/aux_loss, moe/tokens_per_expert_cv (None: a dense model)
    if moe is not None:
        moe.start()
    for _epoch in range(a.ppo_epochs):
        order = torch.randperm(exp.size, generator=gen)
        for start in range(0, exp.size, mini):
            part = exp.select(order[start:start + mini].to(exp.input_ids.device))
            micro = part.split(a.micro_batch_size, max_tokens_per_micro_batch(config))
            share = partial(loss_fn, global_batch=global_batch(part.response_mask, dp_size, dp_group),
                            loss_scale=float(len(micro) * dp_size), vocab_size=vocab)
            optimizer.zero_grad()
            res = forward_micro_batches(module, micro, share, pp_size=pp_size, forward_only=False)
            ok, norm = optimizer.step()
            if ok:
                grad_norms.append(norm)
            else:
                skipped += 1
            for r in res:
                for k, v in r.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
                count += 1
    out = {k: v / max(count, 1) for k, v in sums.items()}
    out["grad_norm"] = sum(grad_norms) / len(grad_norms) if grad_norms else 0.0
    out["skipped_steps"] = float(skipped)
    if moe is not None:
        out.update(moe.finish(dp_group, dp_size))
    return out


def update(exp: Experience, state: TrainerState, spec: AlgorithmSpec, step: int) -> dict[str, float]:
    """Update the actor, then the critic (when there is one); the step's update metrics."""
    cfg, roles = state.config, state.roles
    sizes = dict(config=cfg, dp_size=state.layout.dp_size, pp_size=state.layout.pp_size, step=step,
                 dp_group=state.layout.dp_group)
    metrics = update_model(roles.actor, roles.actor_optimizer, exp,
                           partial(actor_loss, config=cfg, spec=spec, kl_coef=state.kl_ctl.value), **sizes)
    if roles.critic is not None:
        critic_stats = update_model(roles.critic, roles.critic_optimizer, exp, partial(critic_loss, config=cfg),
                                    **sizes)
        metrics["critic_loss"] = critic_stats.pop("critic_loss")
        metrics["vf_clipfrac"] = critic_stats.get("vf_clipfrac", 0.0)
        metrics["critic_grad_norm"] = critic_stats.get("grad_norm", 0.0)
        metrics["critic_skipped_steps"] = critic_stats.get("skipped_steps", 0.0)
    return metrics
