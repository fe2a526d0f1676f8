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
"""

from __future__ import annotations

import argparse
import os
from typing import Optional

from verl_bridge.checkpoint import megatron as mckpt


def _args(trainer) -> argparse.Namespace:
    lay, cfg = trainer.layout, trainer.config
    model_cfg = trainer.roles.actor.config
    return argparse.Namespace(
        tensor_model_parallel_size=lay.tp_size, pipeline_model_parallel_size=lay.pp_size,
        data_parallel_size=lay.dp_size, num_layers=model_cfg.num_layers, hidden_size=model_cfg.hidden_size,
        num_attention_heads=model_cfg.num_attention_heads, num_query_groups=model_cfg.num_query_groups,
        ffn_hidden_size=model_cfg.ffn_hidden_size, seed=cfg.trainer.seed, iteration=trainer.step,
        ckpt_format=cfg.trainer.checkpoint_format,
    )


def checkpoint_root(trainer) -> str:
    return os.path.join(trainer.config.trainer.output_dir, "checkpoints")


def save_trainer_checkpoint(trainer, step: int) -> None:
    cfg = trainer.config
    if not cfg.trainer.output_dir:
        return
    root = checkpoint_root(trainer)
    fmt, keep = cfg.trainer.checkpoint_format, cfg.trainer.keep_last
    args = _args(trainer)
    roles = trainer.roles
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
        "verl_bridge": {"step": step, "kl_ctl": trainer.kl_ctl.state_dict()},
    }, fmt=fmt, keep_last=keep)


def resume_trainer(trainer) -> Optional[int]:
    """Restore the newest complete checkpoint (``resume: auto``) or a given one; return its step."""
    cfg = trainer.config
    mode = cfg.trainer.resume
    if mode == "never":
        return None
    if mode == "auto":
        if not cfg.trainer.output_dir:
            return None
        actor_dir = os.path.join(checkpoint_root(trainer), "actor")
        if not os.path.isdir(actor_dir):
            return None
        iteration = mckpt.latest_valid_iteration(actor_dir)
        if iteration is None:
            return None
    else:
        actor_dir = mode if os.path.basename(os.path.normpath(mode)) == "actor" else os.path.join(mode, "actor")
        iteration = None
    state = mckpt.load(actor_dir, iteration, model=trainer.roles.actor)
    trainer.roles.actor_optimizer.load_state_dict(state["optimizer"])
    extra = state.get("verl_bridge", {})
    step = int(extra.get("step", state.get("iteration", 0)))
    if "kl_ctl" in extra:
        trainer.kl_ctl.load_state_dict(extra["kl_ctl"])
    if trainer.roles.critic is not None:
        critic_dir = os.path.join(os.path.dirname(actor_dir), "critic")
        cstate = mckpt.load(critic_dir, step, model=trainer.roles.critic)
        trainer.roles.critic_optimizer.load_state_dict(cstate["optimizer"])
    mckpt.restore_rng_state(state["rng_state"])
    return step
