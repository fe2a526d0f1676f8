"""``verl-bridge init [--template NAME] [DEST]``: copy a shipped template to start a config."""

from __future__ import annotations

import os
from importlib import resources

import click


def _templates() -> dict[str, str]:
    root = resources.files("verl_bridge.templates")
    return {p.name[:-5]: p.read_text(encoding="utf-8") for p in root.iterdir() if p.name.endswith(".yaml")}


@click.command()
@click.argument("dest", required=False, default=None)
@click.option("--template", "name", default="quickstart", show_default=True, help="Which shipped template.")
@click.option("--force", is_flag=True, help="Overwrite DEST if it exists.")
def init(dest: str | None, name: str, force: bool) -> None:
    """Write a starter config from a shipped template (quickstart, grpo, megatron_ppo)."""
    templates = _templates()
    if name not in templates:
        raise click.UsageError(f"unknown template {name!r}; shipped: {', '.join(sorted(templates))}")
    dest = dest or f"{name}.yaml"
    if os.path.exists(dest) and not force:
        raise click.ClickException(f"{dest} exists; pass --force to overwrite it")
    tmp = dest + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(templates[name])
    os.replace(tmp, dest)
    click.echo(f"wrote {dest} from template {name}")
