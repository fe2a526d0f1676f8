"""Moved to :mod:`verl_bridge.common.routing_replay` (below the layers that use it); this name stays importable."""

from verl_bridge.common.routing_replay import (  # noqa: F401
    ROUTED_KEY,
    RoutingRecorder,
    available,
    check_model,
    replay_objects,
    replaying,
)
