"""Moved to :mod:`verl_bridge.common.precision` (below the layers that use it); this name stays importable."""

from verl_bridge.common.precision import (  # noqa: F401
    DTYPES,
    PrecisionMismatchError,
    cast_like_float16_module,
    model_precision,
    model_precision_flag,
    parameter_dtypes,
    resolve_precision,
)
