"""Make experience: what the update needs beyond the rollout, computed without gradients.

Every forward here runs in eval mode (dropout off, as Megatron-LM / verl compute old log-probs and
values); the update then trains in train mode. Log-probs are over the unpadded vocabulary.

    rollout Experience ─▶ actor forward  ─▶ old log-probs (+ entropy metric, + the rollout-training
                                           mismatch when the engine returned its log-probs)
                       ─▶ critic forward ─▶ values                      (when there is a critic)
                       ─▶ reference fwd  ─▶ reference log-probs, KL     (when there is a reference)
    scores (+ KL in the reward) ─▶ token rewards ─▶ advantages, returns (the algorithm's estimator)
"""

from __future__ import annotations

from typing import Optional

import torch

from verl_bridge import algorithms as A
from verl_bridge.algorithms.registry import AlgorithmSpec
from verl_bridge.algorithms.rollout_correction import rollout_mismatch
from verl_bridge.common.batch import Experience
from verl_bridge.runtime.forward import (eval_mode, forward_micro_batches, response_log_probs_and_entropy,
                                         response_token_log_probs, response_values)
from verl_bridge.runtime.logprobs import unpadded_vocab_size
from verl_bridge.common.state import TrainerState
from verl_bridge.runtime.update import max_tokens_per_micro_batch


def compute_log_probs(model, exp: Experience, *, pp_size: int, temperature: float, micro_batch_size: int,
                      with_entropy: bool = False, max_tokens: Optional[int] = None
                      ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Per-token log-probs ``[B, R]`` of ``exp``'s responses under ``model`` (and the entropy when asked),
    in eval mode, over the model's unpadded vocabulary. ``max_tokens``: packed micro-batches of that
    many real tokens (dynamic batching) instead of ``micro_batch_size`` samples."""
    vocab = unpadded_vocab_size(model)

    def loss_fn(mb, output):
        if with_entropy:
            lp, ent = response_log_probs_and_entropy(output, mb, temperature, vocab)
            out = {"log_probs": lp, "entropy": ent}
        else:
            out = {"log_probs": response_token_log_probs(output, mb, temperature, vocab).detach()}
        return torch.zeros(()), out

    with torch.no_grad(), eval_mode(model):
        res = forward_micro_batches(model, exp.split(micro_batch_size, max_tokens), loss_fn, pp_size=pp_size,
                                    forward_only=True)
    lp = torch.cat([r["log_probs"] for r in res])
    ent = torch.cat([r["entropy"] for r in res]) if with_entropy else None
    return lp, ent


def sequence_log_probs(model, input_ids: torch.Tensor, *, pp_size: int) -> torch.Tensor:
    """Next-token log-probs ``[B, S-1]`` of whole sequences under the training ``model`` (eval mode,
    temperature 1, through the pipeline at PP > 1; every stage returns them): the trainer's side of
    the generation replicas' sync probe (:meth:`verl_bridge.rollout.replica.ReplicaEngine.verify`)."""
    ids = input_ids.long()
    bsz = ids.shape[0]
    ones = torch.ones_like(ids)
    exp = Experience(input_ids=ids, attention_mask=ones, prompt_len=1, response_ids=ids[:, 1:].clone(),
                     response_mask=ones[:, 1:].float(), scores=torch.zeros(bsz))
    lp, _ = compute_log_probs(model, exp, pp_size=pp_size, temperature=1.0, micro_batch_size=bsz)
    return lp.cpu()


def compute_values(critic, exp: Experience, *, pp_size: int, micro_batch_size: int,
                   max_tokens: Optional[int] = None) -> torch.Tensor:
    """The critic's values ``[B, R]`` over ``exp``'s responses (eval mode)."""
    def loss_fn(mb, output):
        return torch.zeros(()), {"values": response_values(output, mb).detach()}

    with torch.no_grad(), eval_mode(critic):
        res = forward_micro_batches(critic, exp.split(micro_batch_size, max_tokens), loss_fn, pp_size=pp_size,
                                    forward_only=True)
    return torch.cat([r["values"] for r in res])


def make_experience(exp: Experience, state: TrainerState, spec: AlgorithmSpec) -> dict[str, float]:
    """Fill ``exp.tensors`` (old_log_probs, values, ref_log_probs, advantages, returns); return metrics."""
    cfg, a, roles = state.config, state.config.algorithm, state.roles
    pp, t, mbs = state.layout.pp_size, cfg.rollout.temperature, a.micro_batch_size
    tok = max_tokens_per_micro_batch(cfg)
    mask = exp.response_mask
    old_lp, entropy = compute_log_probs(roles.actor, exp, pp_size=pp, temperature=t, micro_batch_size=mbs,
                                        with_entropy=True, max_tokens=tok)
    exp.tensors["old_log_probs"] = old_lp
    stats: dict[str, float] = {"entropy": float(A.masked_mean(entropy, mask))}
    if "rollout_log_probs" in exp.tensors:  # how far the engine that sampled is from the trainer
        stats.update(rollout_mismatch(exp.tensors["rollout_log_probs"], old_lp, mask))
    if roles.critic is not None:
        exp.tensors["values"] = compute_values(roles.critic, exp, pp_size=pp, micro_batch_size=mbs, max_tokens=tok)
    coef = state.kl_ctl.value
    if roles.reference is not None:
        ref = roles.reference
        offload = cfg.model.reference is not None and cfg.model.reference.args.offload
        if offload:
            ref.to(state.layout.device)
        ref_lp, _ = compute_log_probs(ref, exp, pp_size=pp, temperature=t, micro_batch_size=mbs, max_tokens=tok)
        if offload:
            ref.to("cpu")
        exp.tensors["ref_log_probs"] = ref_lp
        # one pass gives the KL metric and, when KL sits in the reward, the penalised rewards
        reward_coef = coef if a.kl.placement == "reward" else 0.0
        token_rewards, kl_mean = A.apply_kl_to_rewards(exp.scores, old_lp, ref_lp, mask, reward_coef,
                                                       a.kl.estimator)
    else:
        token_rewards, kl_mean = A.scores_to_token_rewards(exp.scores, mask), 0.0
    adv, ret = A.ADVANTAGE_ESTIMATORS[spec.advantage](
        token_rewards=token_rewards, values=exp.tensors.get("values"), scores=exp.scores, mask=mask,
        gamma=a.gamma, lam=a.lam, group_size=a.group_size, norm_by_std=a.norm_adv_by_std,
    )
    if a.whiten_advantages and spec.advantage == "gae":
        adv = A.masked_whiten(adv, mask)
    exp.tensors["advantages"] = adv
    exp.tensors["returns"] = ret
    stats["kl"] = kl_mean
    stats["kl_coef"] = coef
    return stats
