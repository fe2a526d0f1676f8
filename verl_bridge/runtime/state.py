"""Moved to :mod:`verl_bridge.common.state` (below the layers that use it); this name stays importable."""

from verl_bridge.common.state import (  # noqa: F401
    TrainerState,
)
