"""``model.<role>.placement``: parsing, validation and the ``--dry-run`` layout. Never imports torch.

Constraints of this version (each one is a validation message):

* only ``model.reward`` can run on its own ranks; the actor (with the critic and the reference,
  colocated with it) takes the first ``world - ranks`` ranks;
* megatron-core's ``parallel_state`` is global, so it is initialised once over the whole world
  with the actor's TP size and each group reuses the TP groups that cover its ranks: the reward
  group's ``tp_size`` must equal ``trainer.args.tp_size``, and ``trainer.args.pp_size`` must be 1;
* checkpoint saving (``trainer.save_every``) barriers over the whole world and is not available
  with a separate reward group yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

COLOCATED = "colocated"
ROLES = ("actor", "critic", "reference", "reward")
KEYS = ("ranks", "tp_size", "micro_batch_size")


@dataclass(frozen=True)
class RoleGroup:
    """A role on its own ranks: ``first`` .. ``first + ranks - 1`` of the world."""

    role: str
    first: int
    ranks: int
    tp_size: int
    micro_batch_size: Optional[int] = None  # samples per scoring message; default algorithm.micro_batch_size

    @property
    def dp_size(self) -> int:
        return self.ranks // self.tp_size

    @property
    def rank_list(self) -> list[int]:
        return list(range(self.first, self.first + self.ranks))


def _is_colocated(value: Any) -> bool:
    return value is None or value == COLOCATED


def _parse(key: str, value: Any, problems: list[str], default_tp: int) -> Optional[dict]:
    if _is_colocated(value):
        return None
    if not isinstance(value, dict):
        problems.append(f"{key}={value!r}: expected 'colocated' or a mapping {{ranks: N, tp_size: T}}")
        return None
    out: dict = {}
    for k, v in value.items():
        if k not in KEYS:
            problems.append(f"{key}.{k}: unknown key; allowed keys here: {', '.join(KEYS)}")
            continue
        if v is None and k != "ranks":
            continue
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            problems.append(f"{key}.{k}={v!r}: expected an integer >= 1")
            continue
        out[k] = v
    if "ranks" not in value:
        problems.append(f"{key}: a separate placement needs ranks (how many ranks the role runs on), "
                        f"e.g. {{ranks: 2, tp_size: {default_tp}}}")
    if "ranks" not in out:
        return None
    out.setdefault("tp_size", default_tp)
    return out


def check_placements(problems: list[str], cfg, world_size: int) -> int:
    """Append every placement problem; return the number of ranks the actor group gets."""
    m, ta = cfg.model, cfg.trainer.args
    for role in ("actor", "critic", "reference"):
        r = getattr(m, role)
        if r is not None and not _is_colocated(getattr(r, "placement", COLOCATED)):
            problems.append(f"model.{role}.placement={r.placement!r}: only model.reward can run on its own ranks "
                            "in this version; allowed: colocated (the actor, critic and reference share the "
                            "ranks the reward group leaves)")
    tp = ta.tp_size if isinstance(ta.tp_size, int) and ta.tp_size >= 1 else 1
    spec = _parse("model.reward.placement", m.reward.placement, problems, tp)
    if spec is None:
        return world_size
    key, n, rtp = "model.reward.placement", spec["ranks"], spec.get("tp_size")
    if "tp_size" not in spec:
        return world_size
    if n >= world_size:
        problems.append(f"{key}.ranks={n}: a separate reward group needs at least one rank left for the actor; "
                        f"allowed: 1 .. {world_size - 1} with world size {world_size}")
        return world_size
    if n % rtp:
        problems.append(f"{key}.tp_size={rtp} does not divide its group of {key}.ranks={n} ranks")
    if rtp != ta.tp_size:
        problems.append(f"{key}.tp_size={rtp}: must equal trainer.args.tp_size={ta.tp_size} in this version "
                        "(megatron-core's parallel_state is initialised once over the whole world with the "
                        "actor's TP size and the reward group reuses the TP groups covering its ranks)")
    if ta.pp_size != 1:
        problems.append(f"{key}={m.reward.placement!r}: a separate reward group needs trainer.args.pp_size=1 "
                        f"(got {ta.pp_size}); allowed: colocated with pp_size > 1")
    if cfg.trainer.save_every:
        problems.append(f"trainer.save_every={cfg.trainer.save_every}: checkpoints are not saved with a separate "
                        f"reward group yet ({key}={m.reward.placement!r}); allowed: 0, or placement colocated")
    if m.reward.type == "function" and m.reward.args.path is None and cfg.data.task is None:
        problems.append(f"{key}: the reward group needs a reward: model.reward.args.path or data.task")
    return world_size - n


def reward_group(cfg, world_size: int) -> Optional[RoleGroup]:
    """The reward's group for a validated config, or None when it is colocated."""
    spec = _parse("model.reward.placement", cfg.model.reward.placement, [], cfg.trainer.args.tp_size)
    if spec is None:
        return None
    n = spec["ranks"]
    return RoleGroup("reward", world_size - n, n, spec["tp_size"], spec.get("micro_batch_size"))


def actor_world_size(cfg, world_size: int) -> int:
    g = reward_group(cfg, world_size)
    return world_size - g.ranks if g else world_size


def _span(first: int, n: int) -> str:
    return f"rank {first}" if n == 1 else f"ranks {first}-{first + n - 1}"


def layout_lines(cfg, world_size: int) -> list[str]:
    """The ``--dry-run`` lines: which rank holds which role, TP/PP/DP inside each group."""
    ta = cfg.trainer.args
    g = reward_group(cfg, world_size)
    actor_n = world_size - g.ranks if g else world_size
    mp = ta.tp_size * ta.pp_size
    kl = cfg.algorithm.kl
    colocated = ["actor"] + (["critic"] if cfg.model.critic is not None else [])
    if cfg.model.reference is not None or kl.coef > 0 or kl.target is not None:
        colocated.append("reference")
    if g is None:
        colocated.append(f"reward ({cfg.model.reward.type})")
    lines = [f"placement       {', '.join(colocated)}: {_span(0, actor_n)}  "
             f"TP={ta.tp_size} PP={ta.pp_size} DP={actor_n // mp}"]
    if g is not None:
        mb = g.micro_batch_size or cfg.algorithm.micro_batch_size
        lines.append(f"                reward ({cfg.model.reward.type}): {_span(g.first, g.ranks)}  "
                     f"TP={g.tp_size} PP=1 DP={g.dp_size}; scored asynchronously in micro-batches of {mb} "
                     f"samples sent by each actor DP rank's TP rank 0")
        for rank in range(world_size):
            role = "reward" if rank >= g.first else "actor"
            base = g.first if role == "reward" else 0
            tp = g.tp_size if role == "reward" else ta.tp_size
            local = rank - base
            lines.append(f"                rank {rank}: {role:<6} tp_rank={local % tp} dp_rank={local // tp}")
    return lines
