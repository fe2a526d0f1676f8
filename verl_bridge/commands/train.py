"""``verl-bridge train CONFIG [key=value ...] [--nproc-per-node N] [--dry-run]``."""

from __future__ import annotations

import os
import subprocess
import sys

import click


class ConfigProblem(click.ClickException):
    exit_code = 2


def _load(config_file: str, overrides: tuple[str, ...], world_size: int):
    from verl_bridge.config import ConfigError, load_config

    try:
        return load_config(config_file, list(overrides), world_size=world_size, require_model_source=True)
    except ConfigError as exc:
        raise ConfigProblem(str(exc)) from None


def resolve_world(config_file: str, overrides, nproc: int | None, nnodes: int) -> tuple[int, int]:
    """(nproc_per_node, world size): ``--nproc-per-node``, else ``trainer.nproc_per_node`` from the file."""
    from verl_bridge.config import ConfigError, load_config

    if nproc is None:
        try:
            nproc = load_config(config_file, list(overrides), world_size=1, check_paths=False).trainer.nproc_per_node
        except ConfigError:
            nproc = _raw_nproc(config_file, overrides)
    return nproc, nproc * nnodes


def _raw_nproc(config_file: str, overrides) -> int:
    """``trainer.nproc_per_node`` as written, when validating at world size 1 fails (e.g. tp_size=2)."""
    from verl_bridge.config import ConfigError
    from verl_bridge.config.loader import apply_overrides, read_yaml

    try:
        value = apply_overrides(read_yaml(config_file), list(overrides)).get("trainer", {}).get("nproc_per_node", 1)
    except (ConfigError, AttributeError):
        return 1
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 1


@click.command(context_settings={"ignore_unknown_options": False})
@click.argument("config_file", type=click.Path(dir_okay=False))
@click.argument("overrides", nargs=-1)
@click.option("--nproc-per-node", "nproc", type=click.IntRange(min=1), default=None,
              help="Processes on this node; N > 1 launches torchrun. Default: trainer.nproc_per_node (1).")
@click.option("--nnodes", type=click.IntRange(min=1), default=1, show_default=True, help="Nodes (torchrun).")
@click.option("--dry-run", is_flag=True, help="Validate and print the parallel plan; start nothing.")
@click.option("-v", "--verbose", is_flag=True,
              help="Show megatron-core's start-up fallback warnings in full (also VERL_BRIDGE_VERBOSE=1).")
def train(config_file: str, overrides: tuple[str, ...], nproc: int | None, nnodes: int, dry_run: bool,
          verbose: bool = False) -> None:
    """Run PPO/GRPO training from CONFIG, with optional key=value overrides."""
    from verl_bridge.runtime import mcore_notices

    if verbose:
        os.environ[mcore_notices.VERBOSE_ENV] = "1"  # the torchrun ranks inherit it
    mcore_notices.install()
    nproc, world = resolve_world(config_file, overrides, nproc, nnodes)
    cfg = _load(config_file, overrides, world)
    has_cuda = _has_cuda()
    if dry_run:
        from verl_bridge.commands.plan_text import parallel_plan

        click.echo(f"config OK: {config_file}")
        for line in parallel_plan(cfg, world, has_cuda):
            click.echo(line)
        from verl_bridge.planning import dry_run_lines

        click.echo("\n".join(dry_run_lines(cfg, world, has_cuda)))
        return
    _fetch_models(cfg)
    if world > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", f"--nnodes={nnodes}"]
        if nnodes == 1:
            cmd.append("--standalone")
        cmd += ["-m", "verl_bridge.train", "--config_file", config_file, *overrides]
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        rc = subprocess.call(cmd, env=env)
        if rc != 0:
            raise click.ClickException(f"training failed (torchrun exit code {rc}); see the rank logs above")
        return
    from verl_bridge.train import run

    rc = run(config_file, list(overrides))
    if rc:
        sys.exit(rc)


def _fetch_models(cfg) -> None:
    """Hub ids in model_name_or_path: resolved (downloaded if missing) here, once, before torchrun starts;
    the ranks then read the shared cache (verl_bridge.data.hub)."""
    from verl_bridge.data.hub import prefetch

    problems = prefetch(cfg, echo=click.echo)
    if problems:
        raise ConfigProblem("\n".join(problems))


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except (ImportError, OSError, RuntimeError):  # a broken torch or driver is doctor's business
        return False
