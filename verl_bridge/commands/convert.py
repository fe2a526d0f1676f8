"""``verl-bridge convert SRC DST --to megatron|hf``: offline checkpoint conversion.

HF -> Megatron writes a Megatron-LM save dir (iteration 0) at the requested TP/PP; Megatron ->
HF writes ``model.safetensors`` + ``config.json``. No torchrun, no process groups for the
legacy layout (pure tensor sharding); torch_dist uses a private single-process group.
"""

from __future__ import annotations

import click


class BadInput(click.ClickException):
    """SRC cannot be converted as it is (refused, corrupted or inconsistent files): exit 2."""

    exit_code = 2


@click.command("convert")
@click.argument("src", type=click.Path(exists=True, file_okay=False))
@click.argument("dst", type=click.Path(file_okay=False))
@click.option("--to", "to", type=click.Choice(["megatron", "hf"]), required=True, help="Target layout.")
@click.option("--format", "fmt", type=click.Choice(["legacy", "torch_dist"]), default="legacy",
              show_default=True, help="Megatron layout to write (with --to megatron).")
@click.option("--tp", type=int, default=1, show_default=True, help="Tensor-parallel size to shard for.")
@click.option("--pp", type=int, default=1, show_default=True, help="Pipeline-parallel size to shard for.")
@click.option("--ep", type=int, default=1, show_default=True,
              help="Expert-parallel size to shard a Mixture-of-Experts model for (with --to megatron; legacy layout: "
                   "one mp_rank_TT[_PPP]_EEE directory per EP rank). Megatron -> HF reads it from the checkpoint.")
@click.option("--iteration", type=int, default=None, help="Megatron iteration to export (default: newest valid).")
def convert(src, dst, to, fmt, tp, pp, ep, iteration):
    """Convert SRC (HF safetensors dir or Megatron save dir) into DST.

    Architectures: Llama, Qwen2, Mistral, OPT, and the Mixture-of-Experts Mixtral, Qwen2-MoE and
    Qwen3-MoE (experts split over --ep ranks)."""
    if tp < 1 or pp < 1 or ep < 1:
        raise click.UsageError(f"--tp={tp}, --pp={pp} and --ep={ep} must be >= 1")
    from verl_bridge.runtime import mcore_notices

    # megatron-core's start-up fallback warnings (no TE/apex) fold into one line, as in `train`
    mcore_notices.install()
    try:
        _convert(src, dst, to, fmt, tp, pp, ep, iteration)
    finally:
        line = mcore_notices.summary()
        if line:
            click.echo(f"[INFO] {line}", err=True)


def _convert(src, dst, to, fmt, tp, pp, ep, iteration):
    from pathlib import Path

    from verl_bridge.checkpoint.safe_load import CheckpointError

    try:
        if to == "megatron":
            from verl_bridge.checkpoint.hf import import_hf

            out = import_hf(src, dst, tp=tp, pp=pp, fmt=fmt, ep=ep)
            click.echo(f"wrote Megatron {fmt} checkpoint (TP={tp}, PP={pp}{f', EP={ep}' if ep > 1 else ''}) to {out}")
        else:
            from verl_bridge.checkpoint.hf import export_hf

            if (Path(src) / "config.json").is_file() and not (Path(src) / "latest_checkpointed_iteration.txt").exists():
                raise click.UsageError(f"{src} looks like a Hugging Face directory already; use --to megatron")
            out = export_hf(src, dst, iteration=iteration)
            click.echo(f"wrote Hugging Face safetensors + config.json to {out}")
    except click.ClickException:
        raise
    except CheckpointError as exc:  # refused (pickle allowlist), corrupted or inconsistent input; nothing written
        raise BadInput(f"conversion of {src} failed: {exc}") from None
    except (ValueError, FileNotFoundError, KeyError, RuntimeError) as exc:
        raise click.ClickException(f"conversion of {src} failed: {exc}") from None
    except OSError as exc:  # permissions, a full disk, ... (nothing half-written is left in DST)
        raise BadInput(f"conversion of {src} failed: {exc.strerror or exc} ({exc.filename or dst}). "
                       f"{dst} was left as it was.") from None
    except Exception as exc:  # noqa: BLE001 - one paragraph, never a bare traceback (exit 2: internal error)
        import os
        import traceback

        if os.environ.get("VERL_BRIDGE_DEBUG"):
            traceback.print_exc()
        raise BadInput(f"conversion of {src} failed: {type(exc).__name__}: {exc}. The input is not a checkpoint "
                       "this command can read, or this is a bug: set VERL_BRIDGE_DEBUG=1 for the traceback.") from None
    return 0
