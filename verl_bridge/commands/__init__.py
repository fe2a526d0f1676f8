"""CLI subcommands, one module each, imported lazily by verl_bridge.cli."""
