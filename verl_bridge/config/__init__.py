"""Typed config, loading with overrides, and validation that lists every problem at once."""

from verl_bridge.config.loader import ConfigError, dump_config, load_config  # noqa: F401
from verl_bridge.config.schema import Config  # noqa: F401
