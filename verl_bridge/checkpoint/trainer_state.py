"""Trainer checkpoints: actor and critic as plain Megatron-LM save dirs, plus the RL loop's state.

Layout under ``<trainer.output_dir>/checkpoints``::

    actor/iter_0000010/mp_rank_00/model_optim_rng.pt   (+ latest_checkpointed_iteration.txt)
    critic/iter_0000010/...                            (when the run has a megatron critic)

Each file holds Megatron-LM's keys (``model``, ``optimizer``, ``opt_param_scheduler``,
``rng_state``, ``args``, ``iteration``, ``checkpoint_version``) and, in the actor's, a
``verl_bridge`` entry with the loop state: step (the data position: prompts are a pure function
of seed and step) and the KL controller. The critic is written before the actor, and the
actor's ``latest`` file is the run's commit point, so ``resume: auto`` only ever sees steps whose
critic is complete too.

Both functions receive the run's :class:`~verl_bridge.runtime.state.TrainerState` (config,
layout, roles, KL controller, step), never the trainer.
"""

from __future__ import annotations

import argparse
import os
from typing import Optional

from verl_bridge.checkpoint import megatron as mckpt
from verl_bridge.runtime.state import TrainerState


def _args(state: TrainerState) -> argparse.Namespace:
    lay, cfg = state.layout, state.config
    model_cfg = state.roles.actor.config
    return argparse.Namespace(
        tensor_model_parallel_size=lay.tp_size, pipeline_model_parallel_size=lay.pp_size,
        data_parallel_size=lay.dp_size, num_layers=model_cfg.num_layers, hidden_size=model_cfg.hidden_size,
        num_attention_heads=model_cfg.num_attention_heads, num_query_groups=model_cfg.num_query_groups,
        ffn_hidden_size=model_cfg.ffn_hidden_size, seed=cfg.trainer.seed, iteration=state.step,
        ckpt_format=cfg.trainer.checkpoint_format,
    )


def checkpoint_root(state: TrainerState) -> str:
    return os.path.join(state.config.trainer.output_dir, "checkpoints")


def save_trainer_checkpoint(state: TrainerState, step: int) -> None:
    cfg = state.config
    if not cfg.trainer.output_dir:
        return
    root = checkpoint_root(state)
    fmt, keep = cfg.trainer.checkpoint_format, cfg.trainer.keep_last
    args = _args(state)
    roles = state.roles
    if roles.critic is not None and roles.critic_optimizer is not None:
        mckpt.save(os.path.join(root, "critic"), step, {
            "model": roles.critic, "optimizer": roles.critic_optimizer.state_dict(),
            "opt_param_scheduler": None, "rng_state": mckpt.capture_rng_state(), "args": args,
            "checkpoint_version": 3.0,
        }, fmt=fmt, keep_last=keep)
    mckpt.save(os.path.join(root, "actor"), step, {
        "model": roles.actor, "optimizer": roles.actor_optimizer.state_dict(),
        "opt_param_scheduler": None, "rng_state": mckpt.capture_rng_state(), "args": args,
        "checkpoint_version": 3.0,
        "verl_bridge": {"step": step, "kl_ctl": state.kl_ctl.state_dict()},
    }, fmt=fmt, keep_last=keep)


def resume_trainer(state: TrainerState) -> Optional[int]:
    """Restore the newest complete checkpoint (``resume: auto``) or a given one; return its step."""
    cfg = state.config
    mode = cfg.trainer.resume
    if mode == "never":
        return None
    if mode == "auto":
        if not cfg.trainer.output_dir:
            return None
        actor_dir = os.path.join(checkpoint_root(state), "actor")
        if not os.path.isdir(actor_dir):
            return None
        iteration = mckpt.latest_valid_iteration(actor_dir)
        if iteration is None:
            return None
    else:
        actor_dir = mode if os.path.basename(os.path.normpath(mode)) == "actor" else os.path.join(mode, "actor")
        iteration = None
    saved = mckpt.load(actor_dir, iteration, model=state.roles.actor)
    state.roles.actor_optimizer.load_state_dict(saved["optimizer"])
    extra = saved.get("verl_bridge", {})
    step = int(extra.get("step", saved.get("iteration", 0)))
    if "kl_ctl" in extra:
        state.kl_ctl.load_state_dict(extra["kl_ctl"])
    if state.roles.critic is not None:
        critic_dir = os.path.join(os.path.dirname(actor_dir), "critic")
        cstate = mckpt.load(critic_dir, step, model=state.roles.critic)
        state.roles.critic_optimizer.load_state_dict(cstate["optimizer"])
    mckpt.restore_rng_state(saved["rng_state"])
    return step
