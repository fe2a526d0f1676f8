"""``verl-bridge migrate PATH... [--write] [--out DIR] [--config-out FILE] [--report text|json]``.

Dry run by default: a unified diff, the YAML it would write and a report per file. Exit codes:
0 every file migrated or already migrated, 1 a file was refused, 2 a file could not be parsed
(or an internal error). Only the standard library, libcst and yaml are imported: never torch.
"""

from __future__ import annotations

import difflib
import json
import os

import click


def _expand(paths: tuple[str, ...]) -> list[str]:
    out = []
    for p in paths:
        if os.path.isdir(p):
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                out.extend(os.path.join(root, f) for f in sorted(files) if f.endswith(".py"))
        else:
            out.append(p)
    return out


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _diff(result) -> str:
    old = _text(result.old_source).splitlines(keepends=True)
    new = _text(result.new_source).splitlines(keepends=True)
    return "".join(difflib.unified_diff(old, new, fromfile=f"a/{result.path}", tofile=f"b/{result.script_target}"))


@click.command("migrate")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=True))
@click.option("--write", is_flag=True, help="Apply the change (atomically). Without it: dry run.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write rewritten scripts (and their YAML) into DIR instead of next to the originals.")
@click.option("--config-out", type=click.Path(dir_okay=False), default=None,
              help="Where to write the YAML config (one PATH only). Default: <script>.yaml next to the script.")
@click.option("--report", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="Report format; json prints one JSON object on stdout.")
@click.option("--force", is_flag=True,
              help="With --write: replace an existing <script>.yaml, --config-out FILE or --out DIR/<script>.py.")
def migrate(paths, write, out_dir, config_out, report, force):
    """Rewrite hand-written PPO/GRPO loops into MegatronTrainer(config).train() plus a YAML config."""
    files = _expand(paths)
    if config_out and len(files) != 1:
        raise click.UsageError("--config-out takes exactly one script; give one PATH or drop --config-out")
    if not files:
        raise click.UsageError("no .py files found under the given paths")
    results = [_one(f, write, out_dir, config_out, force) for f in files]
    if report == "json":
        click.echo(json.dumps({"files": [r.report() for r in results]}, indent=2, default=str))
    else:
        for r in results:
            _print_text(r, write)
    statuses = {r.status for r in results}
    if "error" in statuses:
        return 2
    if "refused" in statuses:
        return 1
    return 0


def _existing_targets(path, out_dir, config_out) -> list[str]:
    """Files ``--write`` would replace other than the script itself: its YAML, and with ``--out`` the copy."""
    from verl_bridge.migrate.engine import targets

    script_target, config_target, _ = targets(path, out_dir, config_out)
    found = [config_target] if os.path.lexists(config_target) else []
    if os.path.lexists(script_target) and os.path.realpath(script_target) != os.path.realpath(path):
        found.append(script_target)
    return found


def _one(path, write, out_dir, config_out, force=False):
    """One file; whatever goes wrong is that file's ``error`` entry and the run goes on."""
    from verl_bridge.migrate.engine import FileResult, migrate_file

    try:
        existing = _existing_targets(path, out_dir, config_out) if write and not force else []
        if existing:  # show what would change, write nothing
            result = migrate_file(path, write=False, out_dir=out_dir, config_out=config_out)
            if result.status == "migrated":
                result.status = "refused"
                result.reasons.append(
                    f"{' and '.join(existing)} already exist{'s' if len(existing) == 1 else ''}; --write does not "
                    "replace a file it did not write, so nothing was written (the dry-run diff shows what it would "
                    "do). Add --force to replace it, or choose another --config-out FILE / --out DIR")
                result.target_exists = existing
            return result
        return migrate_file(path, write=write, out_dir=out_dir, config_out=config_out)
    except Exception as exc:  # noqa: BLE001 - the report must always print
        return FileResult(path=path, status="error",
                          reasons=[f"internal error on {path}: {type(exc).__name__}: {exc}; the file was not changed"])


def _print_text(r, write: bool) -> None:
    head = {"migrated": "migrated" if write else "would migrate", "refused": "REFUSED (file not changed)",
            "unchanged": "unchanged (already migrated)", "error": "ERROR (file not changed)"}[r.status]
    if getattr(r, "target_exists", None):
        head = "REFUSED (target exists; nothing written)"
    click.echo(f"== {r.path}: {head}")
    if r.status == "migrated" or getattr(r, "target_exists", None):
        click.echo(_diff(r), nl=False)
        exists = getattr(r, "target_exists", None)
        click.echo(f"-- {r.config_target}" + (" (exists: not replaced)" if exists else "" if write
                                              else " (would be written)"))
        click.echo(r.yaml_text, nl=False)
    for reason in r.reasons:
        click.echo(f"  reason: {reason}")
    for w in r.warnings:
        click.echo(f"  warning: {w}")
    if r.status == "migrated":
        if r.defaults_used:
            click.echo("  not from the script: " + ", ".join(
                f"{k}={v['value']!r} ({v['from']})" for k, v in r.defaults_used.items()))
        for u in r.unmapped:
            click.echo(f"  unmapped (no config key takes it): {u}")
        for k, info in r.to_fill.items():
            click.echo(f"  to fill: {k} (the script takes {info['flag']} from the command line, {info['from']}; "
                       f"the YAML has {info['placeholder']!r})")
    if r.status == "migrated" and not write:
        click.echo("  dry run: nothing written; add --write to apply")
