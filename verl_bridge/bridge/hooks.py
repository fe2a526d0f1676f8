"""Moved to :mod:`verl_bridge.common.hooks` (below the layers that use it); this name stays importable."""

from verl_bridge.common.hooks import (  # noqa: F401
    ACCEPTED_PROVIDER_SIGNATURES,
    HookSignatureError,
    LOADER_SIGNATURES,
    call_load_checkpoint,
    call_model_provider,
    provider_accepts,
)
