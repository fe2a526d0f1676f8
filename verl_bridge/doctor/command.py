"""The ``verl-bridge doctor`` click command.

Exit codes: 0 no errors (nothing matched for --explain, nothing missing for --scan),
1 errors found, or torch / megatron-core could not be verified before the probe deadline
(with --strict, warnings too), 2 usage error or the doctor itself failed.
"""

from __future__ import annotations

import json
import os
import sys

import click

# A cold `import megatron.core` takes ~7 s on a loaded 2-core machine and much longer on a network
# file system; the deadline only cuts imports that hang. A probe cut by it is "unknown", never ok.
DEFAULT_TIMEOUT = 60.0


def _default_timeout() -> float:
    try:
        return float(os.environ.get("VERL_BRIDGE_DOCTOR_TIMEOUT", DEFAULT_TIMEOUT))
    except ValueError:
        return DEFAULT_TIMEOUT


@click.command("doctor", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.option("--strict", is_flag=True, help="Exit 1 on warnings too.")
@click.option("-v", "--verbose", is_flag=True, help="Show the evidence behind every check.")
@click.option("--explain", "explain_src", metavar="FILE|-|TEXT", default=None,
              help="Name the root cause of a traceback or log: a file, - for stdin, or the error text itself.")
@click.option("--scan", "scan_paths", metavar="PATH", multiple=True,
              type=click.Path(exists=True, dir_okay=True, file_okay=True),
              help="Find megatron.core names in your code that the installed megatron-core lacks (repeatable).")
@click.option("--issue", is_flag=True, help="Print a redacted markdown report to paste into a bug report.")
@click.option("--config", "config_path", metavar="FILE", default=None,
              type=click.Path(exists=True, dir_okay=False),
              help="A verl-bridge YAML config; checks the extras its features need (rollout.engine: vllm).")
@click.option("--timeout", type=float, default=None, metavar="SECONDS",
              help=f"Deadline for the import probes (default {DEFAULT_TIMEOUT:g} s, or $VERL_BRIDGE_DOCTOR_TIMEOUT).")
@click.pass_context
def doctor(ctx: click.Context, as_json: bool, strict: bool, verbose: bool, explain_src: str | None,
           scan_paths: tuple[str, ...], issue: bool, config_path: str | None, timeout: float | None) -> None:
    """Diagnose ImportErrors and version clashes across torch, megatron-core, Megatron-LM,
    Transformer Engine, apex, flash-attn, vLLM and NCCL, and print the command that fixes each.

    \b
    Examples:
      verl-bridge doctor                 one line per check
      verl-bridge doctor -v --json       with the evidence, as JSON
      verl-bridge doctor --explain log.txt
      verl-bridge doctor --explain "ImportError: libcuda.so.1: cannot open shared object file"
      verl-bridge doctor --scan train.py
    """
    try:
        if explain_src is not None:
            code = _explain(explain_src, as_json)
        elif scan_paths:
            code = _scan(list(scan_paths), as_json, strict)
        else:
            code = _checks(as_json, strict, verbose, issue, config_path,
                           timeout if timeout is not None else _default_timeout())
    except click.exceptions.Exit:
        raise
    except click.ClickException:
        raise
    except Exception as exc:  # the doctor itself failed: one readable paragraph, exit 2
        click.echo(f"verl-bridge doctor failed: {type(exc).__name__}: {exc}. This is a bug in the doctor, not in "
                   "your environment; please report it with the command you ran.", err=True)
        ctx.exit(2)
        return
    ctx.exit(code)


def _checks(as_json: bool, strict: bool, verbose: bool, issue: bool, config_path: str | None, timeout: float) -> int:
    from . import env
    from .render import issue_report, json_report, text_report
    from .runner import run_checks

    from .runner import progress_line

    results, elapsed = run_checks(config_path=config_path, timeout=max(0.5, timeout), progress=progress_line())
    if issue:
        idx = env.DistIndex()
        versions = {n: idx.version(n) for n in ("verl-bridge", "torch", "megatron-core", "transformer-engine",
                                                "flash-attn", "apex", "vllm", "nvidia-nccl-cu12")}
        click.echo(issue_report(results, versions))
    elif as_json:
        click.echo(json_report(results))
    else:
        click.echo(text_report(results, verbose=verbose, elapsed=elapsed))
    if any(r.blocking for r in results) or (strict and any(r.status != "ok" for r in results)):
        return 1
    return 0


def _explain(src: str, as_json: bool) -> int:
    from .explain import explain

    if src == "-":
        text = sys.stdin.read()
    elif os.path.isfile(src):
        with open(src, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    elif _looks_like_text(src):
        text = src
    else:
        raise click.UsageError(f"--explain: no such file: {src} (give a log file, - to read standard input, "
                               "or the error message itself, e.g. --explain \"ImportError: ...\")")
    matches = explain(text)
    if as_json:
        click.echo(json.dumps({"matches": [m.to_dict() for m in matches]}, indent=2))
    elif not matches:
        click.echo("No known error signature matched. Run `verl-bridge doctor` to check the environment.")
    else:
        best, rest = matches[0], matches[1:]
        if best.confident:
            click.echo(f"1. [{best.id}] {best.cause}")
        else:
            click.echo(f"1. [{best.id}] not sure: {best.cause}")
        label = "fix: " if best.confident else "check: "
        for j, line in enumerate(best.fix.splitlines()):
            click.echo(f"   {label if j == 0 else ' ' * len(label)}{line}")
        if best.source:
            click.echo(f"   seen in: {best.source}")
        if rest:
            click.echo("also matched, less specific (the line above takes precedence): "
                       + ", ".join(m.id for m in rest))
    return 1 if matches else 0


def _looks_like_text(arg: str) -> bool:
    """Literal error text rather than a mistyped file name: it has spaces, a colon or a newline
    and does not look like a path."""
    if "\n" in arg:
        return True
    if os.sep in arg.split(" ", 1)[0] or arg.endswith((".txt", ".log", ".out", ".err")):
        return False
    return " " in arg.strip() or ":" in arg


def _scan(paths: list[str], as_json: bool, strict: bool) -> int:
    from .scan import InstalledMegatron, group, scan, summary_line

    installed = InstalledMegatron()
    findings, notes = scan(paths, installed)
    groups = group(findings)
    if as_json:
        click.echo(json.dumps({"megatron_core": installed.version, "summary": summary_line(findings),
                               "groups": groups, "findings": [f.to_dict() for f in findings], "notes": notes}, indent=2))
    else:
        click.echo(f"installed megatron-core: {installed.version or 'not installed'}")
        click.echo(summary_line(findings))
        marks = {"missing": "✗", "renamed-keyword": "✗", "deprecated": "!", "megatron-lm": "·"}
        for g in groups:
            where = ", ".join(g["where"][:3]) + (f" and {g['count'] - 3} more" if g["count"] > 3 else "")
            times = f" ({g['count']}x)" if g["count"] > 1 else ""
            click.echo(f"{marks.get(g['status'], '?')} {g['name']}{times}: {g['message']}")
            click.echo(f"    at {where}")
            if g["replacement"]:
                click.echo(f"    fix: use {g['replacement']}")
        for n in notes:
            click.echo(f"note: {n}")
        if not findings:
            click.echo("no megatron names that the installed megatron-core lacks")
    statuses = {f.status for f in findings}
    if statuses & {"missing", "renamed-keyword"} or (strict and statuses):
        return 1
    return 0
