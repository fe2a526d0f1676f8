"""``verl-bridge validate CONFIG [key=value ...] [--nproc-per-node N]``: check a config, run nothing."""

from __future__ import annotations

import click


@click.command()
@click.argument("config_file", type=click.Path(dir_okay=False))
@click.argument("overrides", nargs=-1)
@click.option("--nproc-per-node", "nproc", type=click.IntRange(min=1), default=1, show_default=True)
def validate(config_file: str, overrides: tuple[str, ...], nproc: int) -> None:
    """Validate CONFIG; exit 0 when valid, 2 listing every problem otherwise."""
    from verl_bridge.commands.train import ConfigProblem
    from verl_bridge.config import ConfigError, load_config

    try:
        load_config(config_file, list(overrides), world_size=nproc, require_model_source=True)
    except ConfigError as exc:
        raise ConfigProblem(str(exc)) from None
    click.echo(f"config OK: {config_file} (world size {nproc})")
