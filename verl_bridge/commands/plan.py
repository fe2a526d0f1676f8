"""``verl-bridge plan CONFIG [key=value ...]``: parallel layout, per-rank memory, weight-sync cost.

Pure arithmetic on the config and the model's shape (the tiny preset's args, the actor's HF
``config.json``, or ``--model-shape``); no weights are read and no process group starts. Exit code
1 when a rank's estimate exceeds the device memory (the warning lists the remedies with numbers).
"""

from __future__ import annotations

import json

import click


class ConfigProblem(click.ClickException):
    exit_code = 2


@click.command()
@click.argument("config_file", type=click.Path(dir_okay=False))
@click.argument("overrides", nargs=-1)
@click.option("--nproc-per-node", "nproc", type=click.IntRange(min=1), default=None,
              help="Processes per node (default: trainer.nproc_per_node).")
@click.option("--nnodes", type=click.IntRange(min=1), default=1, show_default=True, help="Nodes.")
@click.option("--device-memory-gb", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Memory of one device in GiB (an '80 GB' card: 80). Default: detected with CUDA.")
@click.option("--model-shape", default=None,
              help="Actor shape without weights: a built-in name (e.g. opt-1.3b) or a config.json path.")
@click.option("--bandwidth-gbps", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Weight-sync bandwidth in Gbit/s. Default: measured by a local tensor copy.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def plan(config_file, overrides, nproc, nnodes, device_memory_gb, model_shape, bandwidth_gbps, as_json):
    """Estimate per-rank memory and weight-sync cost of CONFIG before launching it."""
    from verl_bridge.config import ConfigError, load_config
    from verl_bridge.planning import detect_device_memory
    from verl_bridge.planning.memory import GiB, memory_table, plan_memory
    from verl_bridge.planning.refit import plan_refit, refit_lines
    from verl_bridge.planning.shapes import ShapeError, resolve_shape

    from verl_bridge.commands.train import resolve_world

    nproc, world = resolve_world(config_file, overrides, nproc, nnodes)
    try:  # a plan needs no files on disk: paths are not checked
        cfg = load_config(config_file, list(overrides), world_size=world, check_paths=False,
                          require_model_source=True)
    except ConfigError as exc:
        raise ConfigProblem(str(exc)) from None
    try:
        shape, shape_source = resolve_shape(cfg, model_shape)
    except ShapeError as exc:
        raise ConfigProblem(str(exc)) from None
    if device_memory_gb is not None:
        device, device_source = device_memory_gb * GiB, f"given: --device-memory-gb {device_memory_gb:g}"
    else:
        device, device_source = detect_device_memory()
    from verl_bridge.commands.plan_text import parallel_plan

    has_cuda = device_source.startswith("detected")
    layout_lines = parallel_plan(cfg, world, has_cuda)
    mem = plan_memory(cfg, world, shape, shape_source, device, device_source)
    refit = plan_refit(shape, cfg.trainer.precision, cfg.rollout.bucket_mb, bandwidth_gbps, measure=True,
                       tp=cfg.trainer.args.tp_size, pp=cfg.trainer.args.pp_size)
    fits = None if device is None else mem.worst.peak <= device
    if as_json:
        click.echo(json.dumps({"config": config_file, "world_size": world, "parallel_plan": layout_lines,
                               "memory": mem.to_dict(), "refit": refit.to_dict(), "warnings": mem.warnings,
                               "fits": fits}, indent=2))
    else:
        for line in layout_lines + memory_table(mem) + refit_lines(refit, cfg.trainer.precision):
            click.echo(line)
        for n in mem.notes:
            click.echo(f"note            {n}")
        if device is None:
            click.echo(f"device memory   {device_source}")
        for w in mem.warnings:
            click.echo(f"warning         {w}")
        if fits:
            click.echo(f"fits            peak {mem.worst.peak / GiB:.2f} GiB of {device / GiB:.2f} GiB per device "
                       f"({mem.worst.kind})")
    if fits is False:
        raise click.exceptions.Exit(1)
