"""Trainer checkpoints: actor and critic as plain Megatron-LM save dirs, plus the RL loop's state.

Layout under ``<trainer.output_dir>/checkpoints``::

    actor/iter_0000010/mp_rank_00/model_optim_rng.pt   (+ latest_checkpointed_iteration.txt)
    critic/iter_0000010/...                            (when the run has a megatron critic)
    step_0000010.complete                              the step's completion marker (JSON)

Each file holds Megatron-LM's keys (``model``, ``optimizer``, ``opt_param_scheduler``,
``rng_state``, ``args``, ``iteration``, ``checkpoint_version``) and, in the actor's, a
``verl_bridge`` entry with the loop state: step (the data position: prompts are a pure function
of seed and step) and the KL controller. Every iteration directory carries a checksum manifest.

A step is one unit. Every rank writes the actor and the critic under ``iter_*.tmp-save``; then
rank 0 renames both into place, writes ``step_XXXXXXX.complete`` (the commit point), then the
two ``latest_checkpointed_iteration.txt`` trackers (what plain Megatron-LM reads), then prunes
whole steps beyond ``trainer.keep_last`` (marker first, then the role directories). A kill
anywhere leaves the previous complete step resumable, and the trackers never point at a step
whose other role is missing.

``resume: auto`` takes the newest step with a marker whose actor (and critic) pass
:func:`~verl_bridge.checkpoint.megatron.validate_iteration` (checksums, structure, allowlist),
falling back to older complete steps with a warning that names the unusable file. Checkpoints
written before markers existed count as complete when every role has the iteration. When the run
directory holds checkpoints or metrics but no usable step, it refuses (nothing is truncated or
overwritten) instead of starting again at step 1.

Both functions receive the run's :class:`~verl_bridge.common.state.TrainerState` (config,
layout, roles, KL controller, step), never the trainer.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
from typing import Optional

import torch

from verl_bridge.checkpoint import megatron as mckpt
from verl_bridge.checkpoint.layout import atomic_write_text, iter_dir, list_iterations
from verl_bridge.checkpoint.safe_load import CheckpointError, CorruptCheckpointError
from verl_bridge.common.log import warn
from verl_bridge.common.state import TrainerState

log = logging.getLogger(__name__)


def _args(state: TrainerState) -> argparse.Namespace:
    lay, cfg = state.layout, state.config
    model_cfg = state.roles.actor.config
    return argparse.Namespace(
        tensor_model_parallel_size=lay.tp_size, pipeline_model_parallel_size=lay.pp_size,
        data_parallel_size=lay.dp_size, expert_model_parallel_size=getattr(lay, "ep_size", 1), num_layers=model_cfg.num_layers, hidden_size=model_cfg.hidden_size,
        num_attention_heads=model_cfg.num_attention_heads, num_query_groups=model_cfg.num_query_groups,
        ffn_hidden_size=model_cfg.ffn_hidden_size, seed=cfg.trainer.seed, iteration=state.step,
        ckpt_format=cfg.trainer.checkpoint_format, **_model_args(state.roles.actor),
    )


def _model_args(actor) -> dict:
    """The architecture fields Megatron-LM's ``args`` carry (and ``verl-bridge convert --to hf`` reads
    to rebuild the model): without them a trained checkpoint matched no registered architecture."""
    from verl_bridge.compat import unwrap_model

    model, cfg = unwrap_model(actor), actor.config
    heads, groups = cfg.num_attention_heads, cfg.num_query_groups or cfg.num_attention_heads
    padded = getattr(model, "vocab_size", None)
    pos = getattr(model, "position_embedding_type", cfg.position_embedding_type if hasattr(cfg, "position_embedding_type") else "rope")
    act = getattr(cfg.activation_func, "__name__", "gelu")
    return dict(
        kv_channels=cfg.kv_channels or cfg.hidden_size // heads, group_query_attention=groups != heads,
        max_position_embeddings=getattr(model, "max_sequence_length", None),
        seq_length=getattr(model, "max_sequence_length", None), position_embedding_type=pos,
        use_rotary_position_embeddings=pos == "rope", add_position_embedding=pos == "learned_absolute",
        rotary_base=getattr(model, "rotary_base", 10000), normalization=cfg.normalization,
        norm_epsilon=cfg.layernorm_epsilon, swiglu=bool(cfg.gated_linear_unit), add_qkv_bias=bool(cfg.add_qkv_bias),
        add_bias_linear=bool(cfg.add_bias_linear),
        untie_embeddings_and_output_weights=not getattr(model, "share_embeddings_and_output_weights", False),
        vocab_size=getattr(model, "hf_vocab_size", None) or padded, padded_vocab_size=padded,
        sequence_parallel=bool(cfg.sequence_parallel), hf_activation=act if act in ("relu", "silu", "gelu") else "gelu",
        **_moe_model_args(cfg),
    )


def _moe_model_args(cfg) -> dict:
    """Megatron-LM's MoE args of an MoE model (``num_experts`` None for a dense one, as Megatron-LM)."""
    if getattr(cfg, "num_moe_experts", None) is None:
        return {"num_experts": None}
    keys = ("moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "moe_aux_loss_coeff",
            "moe_router_load_balancing_type", "moe_router_score_function", "moe_router_pre_softmax",
            "moe_router_enable_expert_bias", "moe_token_dispatcher_type", "moe_grouped_gemm")
    return {"num_experts": cfg.num_moe_experts, **{k: getattr(cfg, k) for k in keys if hasattr(cfg, k)}}


def checkpoint_root(state: TrainerState) -> str:
    return os.path.join(state.config.trainer.output_dir, "checkpoints")


MARKER_PREFIX, MARKER_SUFFIX = "step_", ".complete"


def marker_path(root, step: int) -> str:
    return os.path.join(root, f"{MARKER_PREFIX}{int(step):07d}{MARKER_SUFFIX}")


def complete_steps(root) -> list[int]:
    """Steps with a completion marker under *root*, newest first."""
    out = []
    if os.path.isdir(root):
        for name in os.listdir(root):
            if name.startswith(MARKER_PREFIX) and name.endswith(MARKER_SUFFIX):
                try:
                    out.append(int(name[len(MARKER_PREFIX):-len(MARKER_SUFFIX)]))
                except ValueError:
                    continue
    return sorted(out, reverse=True)


def _role_names(state: TrainerState) -> list[str]:
    roles = state.roles
    return (["critic"] if roles.critic is not None and roles.critic_optimizer is not None else []) + ["actor"]


def save_trainer_checkpoint(state: TrainerState, step: int) -> None:
    """Collective: actor, critic and trainer state of *step* published as one unit (module docstring)."""
    cfg = state.config
    if not cfg.trainer.output_dir:
        return
    root = checkpoint_root(state)
    fmt, keep = cfg.trainer.checkpoint_format, cfg.trainer.keep_last
    args = _args(state)
    roles = state.roles
    written = {}
    if "critic" in _role_names(state):
        written["critic"] = mckpt.write(os.path.join(root, "critic"), step, {
            "model": roles.critic, "optimizer": roles.critic_optimizer.state_dict(),
            "opt_param_scheduler": None, "rng_state": mckpt.capture_rng_state(), "args": args,
            "checkpoint_version": 3.0,
        }, fmt=fmt)
    written["actor"] = mckpt.write(os.path.join(root, "actor"), step, {
        "model": roles.actor, "optimizer": roles.actor_optimizer.state_dict(),
        "opt_param_scheduler": None, "rng_state": mckpt.capture_rng_state(), "args": args,
        "checkpoint_version": 3.0,
        "verl_bridge": {"step": step, "kl_ctl": state.kl_ctl.state_dict()},
    }, fmt=fmt)
    if not mckpt.is_dist() or torch.distributed.get_rank() == 0:
        publish_step(root, step, written, fmt=fmt, keep_last=keep)
    mckpt.barrier()


def publish_step(root, step: int, written: dict, *, fmt: str, keep_last: Optional[int]) -> None:
    """Rank 0: rename every role's ``.tmp-save`` into place, write the marker, the trackers, prune."""
    for name, tmp in written.items():
        mckpt.publish(os.path.join(root, name), tmp, step, tracker=False)
    atomic_write_text(marker_path(root, step), json.dumps({"step": step, "roles": sorted(written), "format": fmt}))
    for name in written:
        mckpt.write_tracker(os.path.join(root, name), step)
    if keep_last is not None and keep_last > 0:
        # only this step and older ones count: a newer step belongs to another run (never pruned here)
        for old in [s for s in complete_steps(root) if s <= step][keep_last:]:
            os.remove(marker_path(root, old))  # the step stops being resumable first
            for name in ("actor", "critic"):
                shutil.rmtree(iter_dir(os.path.join(root, name), old), ignore_errors=True)


def _candidates(root, roles: list[str]) -> tuple[list[int], bool]:
    """(steps to try newest first, whether they come from completion markers)."""
    marked = complete_steps(root)
    if marked:
        return marked, True
    per_role = [set(list_iterations(os.path.join(root, r))) for r in roles]
    return sorted(set.intersection(*per_role), reverse=True), False  # written before markers existed


def _leftovers(state: TrainerState, root: str) -> list[str]:
    found = []
    for name in ("actor", "critic"):
        its = list_iterations(os.path.join(root, name))
        if its:
            found.append(f"{name} iterations {sorted(its)} in {os.path.join(root, name)}")
    markers = complete_steps(root)
    if markers:
        found.append(f"completion markers for steps {sorted(markers)}")
    metrics = os.path.join(state.config.trainer.output_dir, "metrics.jsonl")
    if os.path.isfile(metrics) and os.path.getsize(metrics) > 0:
        found.append(f"{metrics} ({os.path.getsize(metrics)} bytes)")
    return found


def choose_resume_step(state: TrainerState) -> Optional[int]:
    """Rank 0's choice for ``resume: auto``: the newest complete, intact step (None: start afresh).

    Raises :class:`CheckpointError` when the directory holds a previous run but no usable step.
    """
    root = checkpoint_root(state)
    roles = _role_names(state)
    steps, marked = _candidates(root, roles)
    problems = []
    for step in steps:
        try:
            for name in roles:
                mckpt.validate_iteration(os.path.join(root, name), step)
        except CorruptCheckpointError as exc:
            problems.append(f"step {step}: {exc}")
            log.warning("checkpoint step %d is unusable, trying an older one: %s", step, exc)
            warn(f"checkpoint step {step} is unusable ({exc}); trying an older complete step")
            continue
        if problems:
            warn(f"resuming from step {step}, the newest intact complete step (newer ones are unusable, see above)")
        return step
    found = _leftovers(state, root)
    if not found:
        return None  # a fresh directory: nothing to resume
    detail = "; ".join(problems) if problems else (
        "no step has both " + " and ".join(roles) + " complete" if not marked else "no complete step is intact")
    raise CheckpointError(
        f"trainer.resume=auto found no usable checkpoint in {root} ({detail}). Found: {'; '.join(found)}. "
        "No checkpoint and no metrics were changed. Restore a good checkpoint there, point trainer.resume at another checkpoint "
        "directory, or start a new run from step 1 with trainer.resume=never trainer.overwrite=true (which deletes "
        "these checkpoints and metrics.jsonl).")


def resume_trainer(state: TrainerState) -> Optional[int]:
    """Restore the newest complete checkpoint (``resume: auto``) or a given one; return its step."""
    cfg = state.config
    mode = cfg.trainer.resume
    if mode == "never":
        return None
    validated = False
    if mode == "auto":
        if not cfg.trainer.output_dir:
            return None
        actor_dir = os.path.join(checkpoint_root(state), "actor")
        iteration = _agree(state)
        if iteration is None:
            return None
        validated = True
    else:
        actor_dir = mode if os.path.basename(os.path.normpath(mode)) == "actor" else os.path.join(mode, "actor")
        iteration = None
    saved = mckpt.load(actor_dir, iteration, model=state.roles.actor, validated=validated)
    state.roles.actor_optimizer.load_state_dict(saved["optimizer"])
    extra = saved.get("verl_bridge", {})
    step = int(extra.get("step", saved.get("iteration", 0)))
    if "kl_ctl" in extra:
        state.kl_ctl.load_state_dict(extra["kl_ctl"])
    if state.roles.critic is not None:
        critic_dir = os.path.join(os.path.dirname(actor_dir), "critic")
        cstate = mckpt.load(critic_dir, step, model=state.roles.critic, validated=validated)
        state.roles.critic_optimizer.load_state_dict(cstate["optimizer"])
    mckpt.restore_rng_state(saved["rng_state"])
    return step


def _agree(state: TrainerState) -> Optional[int]:
    """Rank 0 chooses the step (reading every file once); all ranks get its choice or its error."""
    choice: list = [None]
    if not mckpt.is_dist() or torch.distributed.get_rank() == 0:
        try:
            choice = [("ok", choose_resume_step(state))]
        except CheckpointError as exc:
            choice = [("error", str(exc))]
    if mckpt.is_dist():
        torch.distributed.broadcast_object_list(choice, src=0)
    kind, value = choice[0]
    if kind == "error":
        raise CheckpointError(value)
    return value
