"""``verl-bridge train CONFIG [key=value ...] [--nproc-per-node N] [--dry-run]``."""

from __future__ import annotations

import os
import signal
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
        rc, signum = launch(cmd, env)
        if signum is not None:  # the ranks saved their last finished step and said how to resume
            click.echo(f"verl-bridge train: stopped by {signal.Signals(signum).name} (exit {128 + signum}); "
                       "resume with the same command plus trainer.resume=auto", err=True)
            sys.exit(128 + signum)
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


def _die_with_parent() -> None:  # runs in the child between fork and exec
    import ctypes

    ctypes.CDLL(None).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG: SIGTERM when we die


def launch(cmd: list[str], env: dict) -> tuple[int, int | None]:
    """Run torchrun and wait for it: (its exit code, the signal forwarded or None).

    torchrun runs in its own session, so a terminal's Ctrl-C reaches it (and the ranks) once, through
    us; SIGTERM and SIGINT are forwarded to it, and it forwards them to every rank and waits for them
    (the ranks save and stop at the next step boundary). On Linux torchrun gets SIGTERM when this
    process dies, even by SIGKILL, and the ranks get SIGTERM when torchrun dies, so no rank outlives
    the launcher. We return only once torchrun has exited."""
    linux = sys.platform.startswith("linux")
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=_die_with_parent if linux else None)
    received: list[int] = []

    def forward(signum, frame):
        received.append(signum)
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            try:
                rc = proc.wait()
                break
            except KeyboardInterrupt:  # pragma: no cover - SIGINT is handled above
                continue
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    return rc, (received[0] if received else None)


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except (ImportError, OSError, RuntimeError):  # a broken torch or driver is doctor's business
        return False
