"""The parallel plan printed by ``verl-bridge train --dry-run``: pure arithmetic on the config."""

from __future__ import annotations

from verl_bridge.config import Config


def _source(role) -> str:
    a = role.args
    for key in ("preset", "model_provider", "model_name_or_path", "path"):
        v = getattr(a, key, None)
        if v:
            return f"{key}={v}"
    return "built-in"


def parallel_plan(cfg: Config, world_size: int, has_cuda: bool) -> list[str]:
    ta, d, a = cfg.trainer.args, cfg.data, cfg.algorithm
    from verl_bridge.placement.spec import actor_world_size, layout_lines

    dp = actor_world_size(cfg, world_size) // (ta.tp_size * ta.pp_size)
    samples = d.rollout_batch_size * a.group_size
    per_rank = samples // dp
    mini = a.mini_batch_size or samples
    micro_per_rank = (mini // dp) // a.micro_batch_size
    from verl_bridge.config.derived import rollout_tp_size, rollout_workers

    rtp = rollout_tp_size(cfg)
    workers = rollout_workers(actor_world_size(cfg, world_size), rtp)
    lines = [
        f"world size      {world_size}  (nproc-per-node)",
        f"parallelism     TP={ta.tp_size} PP={ta.pp_size} DP={dp} SP={ta.sequence_parallel}",
        f"rollout         engine={cfg.rollout.engine} workers={workers} (N/t, t={rtp}"
        f"{'' if d.num_rollout_workers else ', derived'}) "
        f"prompts/step={d.rollout_batch_size} x group_size={a.group_size} = {samples} samples",
        f"per DP rank     {per_rank} samples; mini-batch {mini // dp}/rank -> {mini // dp // a.micro_batch_size} "
        f"micro-batches of {a.micro_batch_size}; {samples // mini} optimizer step(s) x {a.ppo_epochs} epoch(s)",
        f"algorithm       {a.name} (kl {a.kl.estimator} in {a.kl.placement}, coef {a.kl.coef}"
        + (f", adaptive target {a.kl.target}" if a.kl.target else "") + ")",
        f"roles           actor: {cfg.model.actor.type} ({_source(cfg.model.actor)})",
    ]
    if cfg.model.critic is not None:
        lines.append(f"                critic: {cfg.model.critic.type} ({_source(cfg.model.critic)})")
    ref = "frozen copy of the actor's initial weights" if (a.kl.coef > 0 or a.kl.target or cfg.model.reference) else "none (kl.coef is 0)"
    lines.append(f"                reference: {ref}")
    lines.append(f"                reward: {cfg.model.reward.type} ({_source(cfg.model.reward) if cfg.model.reward.args.path else 'task ' + str(d.task)})")
    lines += layout_lines(cfg, world_size)
    lines.append(f"output          {cfg.trainer.output_dir} (metrics.jsonl, config.yaml, checkpoints/)")
    notes = []
    if ta.pp_size > 1 and not has_cuda:
        notes.append(f"PP={ta.pp_size} on CPU: megatron-core's pipeline schedules over gloo (verl_bridge.compat.pipeline); "
                     f"rollout on {world_size // max(ta.tp_size, 1)} generation replicas (whole model per TP group)")
    if ta.sequence_parallel and ta.tp_size == 1:
        notes.append("sequence_parallel has no effect with tp_size=1")
    if micro_per_rank < 1:
        notes.append("fewer samples per rank than one micro-batch")
    return lines + [f"note            {n}" for n in notes]
