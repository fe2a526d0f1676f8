"""Moved to :mod:`verl_bridge.common.roles` (below the layers that use it); this name stays importable."""

from verl_bridge.common.roles import (  # noqa: F401
    Roles,
    ValueHead,
    frozen_copy,
    to_critic,
)
