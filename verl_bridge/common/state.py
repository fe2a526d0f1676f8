"""``TrainerState``: what one run carries from step to step, and what a checkpoint saves and restores.

The trainer owns one; :mod:`verl_bridge.runtime.experience`, :mod:`verl_bridge.runtime.update`
and :mod:`verl_bridge.checkpoint.trainer_state` receive it instead of the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from verl_bridge.config.schema import Config
from verl_bridge.distributed.layout import ParallelLayout
from verl_bridge.common.roles import Roles


@dataclass
class TrainerState:
    config: Config
    layout: ParallelLayout
    roles: Roles
    kl_ctl: Any  # a verl_bridge.algorithms.kl_control controller (value, update, state_dict)
    step: int = 0  # the last finished step (the data position: prompts are a function of seed and step)
