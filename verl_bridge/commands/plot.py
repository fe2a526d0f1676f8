"""``verl-bridge plot RUN_DIR [--out FILE]``: reward, KL, losses and throughput over steps as a PNG.

When the run evaluated (``eval/*`` keys, see :mod:`verl_bridge.runtime.evaluation`), an
"evaluation" panel shows ``eval/reward_mean`` and ``eval/accuracy`` too.
"""

from __future__ import annotations

import json
import os

import click

PANELS = (
    ("reward", ("reward_mean", "eval/reward_mean")),
    ("KL", ("kl",)),
    ("losses", ("actor_loss", "critic_loss")),
    ("throughput (tokens/s)", ("throughput_tokens_per_s",)),
)
EVAL_PANEL = ("evaluation", ("eval/reward_mean", "eval/accuracy"))


def read_metrics(run_dir: str) -> list[dict]:
    path = os.path.join(run_dir, "metrics.jsonl") if os.path.isdir(run_dir) else run_dir
    if not os.path.exists(path):
        raise click.ClickException(f"{path} does not exist; point plot at a run directory (trainer.output_dir)")
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise click.ClickException(f"{path}:{lineno}: not a JSON object ({exc.msg})") from None
    if not rows:
        raise click.ClickException(f"{path} holds no steps yet")
    return rows


def build_figure(rows: list[dict], title: str = ""):
    """The matplotlib figure of ``rows``: 2x2 panels, 2x3 with the evaluation panel when eval ran."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(PANELS)
    if any(k in r for r in rows for k in EVAL_PANEL[1]):
        panels.append(EVAL_PANEL)
    cols = 2 if len(panels) <= 4 else 3
    fig, axes = plt.subplots(2, cols, figsize=(5 * cols, 7))
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    for ax, (name, keys) in zip(axes.flat, panels):
        for key in keys:
            pts = [(r["step"], r[key]) for r in rows if key in r]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="o" if len(pts) < 30 else None, ms=3, label=key)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_metrics(rows: list[dict], out: str, title: str = "") -> str:
    import matplotlib.pyplot as plt

    fig = build_figure(rows, title)
    tmp = out + ".tmp.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, out)
    return out


@click.command()
@click.argument("run_dir", type=click.Path())
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="PNG path (default RUN_DIR/metrics.png).")
def plot(run_dir: str, out: str | None) -> None:
    """Plot reward, KL, losses and throughput of a run as a PNG."""
    rows = read_metrics(run_dir)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise click.ClickException("plot needs matplotlib: pip install 'verl-bridge[plot]'") from None
    out = out or os.path.join(run_dir if os.path.isdir(run_dir) else os.path.dirname(run_dir), "metrics.png")
    plot_metrics(rows, out, title=os.path.basename(os.path.abspath(run_dir)))
    click.echo(f"wrote {out} ({len(rows)} steps)")
