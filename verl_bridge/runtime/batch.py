"""Moved to :mod:`verl_bridge.common.batch` (below the layers that use it); this name stays importable."""

from verl_bridge.common.batch import (  # noqa: F401
    Experience,
    Packed,
    model_inputs,
    pack,
    response_outputs,
    response_slice,
)
