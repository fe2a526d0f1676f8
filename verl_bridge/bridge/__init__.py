"""Wrap a user's Megatron hooks (model_provider, initialize_megatron, load_checkpoint) into roles."""

from verl_bridge.bridge.architecture import resolve_architecture  # noqa: F401
from verl_bridge.bridge.core import BridgeError, MegatronBridge  # noqa: F401
from verl_bridge.common.hooks import (  # noqa: F401
    ACCEPTED_PROVIDER_SIGNATURES,
    HookSignatureError,
    call_load_checkpoint,
    call_model_provider,
)
