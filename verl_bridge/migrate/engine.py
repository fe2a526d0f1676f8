"""One file through the migration: parse, analyse, rewrite, render the YAML; write on request.

``migrate_file`` never touches the disk unless ``write=True`` and the file migrated; refused,
unchanged and unparsable files are left byte-identical. Writes are atomic (YAML first, then the
script), so an interrupted run leaves either the old script or the complete new pair.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from typing import Optional

import libcst as cst
from libcst.codemod import CodemodContext, SkipFile

from verl_bridge.codemods.migrate_ppo_loop import MigratePPOLoopCommand, module_name_for
from verl_bridge.migrate.writes import atomic_write
from verl_bridge.migrate.yamlout import render_yaml

CONFLICT_RE = re.compile(rb"^(<<<<<<<|=======|>>>>>>>)( |$|\r?\n)", re.M)


@dataclass
class FileResult:
    path: str
    status: str  # migrated | refused | unchanged | error
    reasons: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    config: dict = field(default_factory=dict)
    provenance: dict = field(default_factory=dict)
    old_source: bytes = b""
    new_source: Optional[bytes] = None
    yaml_text: Optional[str] = None
    script_target: Optional[str] = None
    config_target: Optional[str] = None

    def report(self) -> dict:
        d = asdict(self)
        return {k: d[k] for k in ("path", "status", "reasons", "warnings", "config", "provenance")}


def targets(path: str, out_dir: Optional[str], config_out: Optional[str]) -> tuple[str, str, str]:
    """(script target, config target, config path relative to the script's folder, posix)."""
    script_target = os.path.join(out_dir, os.path.basename(path)) if out_dir else path
    stem = module_name_for(path)
    config_target = config_out or os.path.join(os.path.dirname(script_target), f"{stem}.yaml")
    rel = os.path.relpath(os.path.abspath(config_target), os.path.dirname(os.path.abspath(script_target)))
    return script_target, config_target, rel.replace(os.sep, "/")


def migrate_source(source: bytes, path: str, config_rel: Optional[str] = None) -> FileResult:
    """Analyse and rewrite *source* (the bytes of *path*) without touching the disk."""
    result = FileResult(path=path, status="error", old_source=source)
    m = CONFLICT_RE.search(source)
    if m is not None:
        line = source[: m.start()].count(b"\n") + 1
        result.reasons.append(f"{os.path.basename(path)}:{line}: merge-conflict marker; resolve the conflict first")
        return result
    try:
        tree = cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        result.reasons.append(f"{os.path.basename(path)}:{exc.raw_line}: cannot parse: {exc.message}")
        return result
    except (UnicodeDecodeError, LookupError) as exc:
        result.reasons.append(f"{os.path.basename(path)}: cannot decode: {exc}")
        return result
    cmd = MigratePPOLoopCommand(CodemodContext(filename=path), config_path=config_rel)
    try:
        new_tree = cmd.transform_module(tree)
    except SkipFile:
        pass
    except Exception as exc:  # noqa: BLE001 - a bug of ours must not look like a refusal
        result.reasons.append(f"internal error while analysing {os.path.basename(path)}: "
                              f"{type(exc).__name__}: {exc}")
        return result
    analysis = cmd.analysis
    if analysis is None:
        result.reasons.append("internal error: no analysis")
        return result
    result.reasons = list(analysis.reasons)
    result.warnings = list(analysis.warnings)
    if analysis.status == "refuse":
        result.status = "refused"
        return result
    if analysis.status == "unchanged":
        result.status = "unchanged"
        return result
    result.config = dict(analysis.config)
    result.provenance = dict(analysis.provenance)
    new_source = new_tree.bytes
    try:
        cst.parse_module(new_source)
        compile(new_source, path, "exec")
    except (cst.ParserSyntaxError, SyntaxError) as exc:
        result.status = "error"
        result.reasons.append(f"internal error: the rewritten {os.path.basename(path)} does not parse ({exc})")
        return result
    result.status = "migrated"
    result.new_source = new_source
    result.yaml_text = render_yaml(result.config, result.provenance, os.path.basename(path))
    return result


def migrate_file(path: str, *, write: bool = False, out_dir: Optional[str] = None,
                 config_out: Optional[str] = None) -> FileResult:
    script_target, config_target, rel = targets(path, out_dir, config_out)
    try:
        with open(path, "rb") as fh:
            source = fh.read()
    except OSError as exc:
        return FileResult(path=path, status="error", reasons=[f"cannot read {path}: {exc.strerror}"])
    result = migrate_source(source, path, rel)
    result.script_target, result.config_target = script_target, config_target
    if write and result.status == "migrated":
        atomic_write(config_target, result.yaml_text.encode("utf-8"))
        atomic_write(script_target, result.new_source)
    return result
