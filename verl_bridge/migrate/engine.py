"""One file through the migration: parse, analyse, rewrite, validate the YAML; write on request.

``migrate_file`` never touches the disk unless ``write=True`` and the file migrated; refused,
unchanged and unparsable files are left byte-identical. Writes are atomic (YAML first, then the
script), so an interrupted run leaves either the old script or the complete new pair; a symlinked
script is written through to its target, a read-only one is refused before anything is written.
"""

from __future__ import annotations

import math
import os
import re
import stat
import sys
from dataclasses import asdict, dataclass, field
from typing import Optional

import libcst as cst
from libcst.codemod import CodemodContext, SkipFile

from verl_bridge.codemods.migrate_ppo_loop import MigratePPOLoopCommand, module_name_for
from verl_bridge.migrate.writes import atomic_write
from verl_bridge.migrate.yamlout import nest, render_yaml

CONFLICT_RE = re.compile(rb"^(<<<<<<<|=======|>>>>>>>)( |$|\r?\n)", re.M)
REPORT_KEYS = ("path", "status", "reasons", "warnings", "config", "provenance", "defaults_used", "unmapped", "to_fill")


@dataclass
class FileResult:
    path: str
    status: str  # migrated | refused | unchanged | error
    reasons: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    config: dict = field(default_factory=dict)
    provenance: dict = field(default_factory=dict)
    defaults_used: dict = field(default_factory=dict)  # key -> {"value", "from"}: not read from the source
    unmapped: list = field(default_factory=list)  # "name=value (file:line)": in the source, no key takes it
    # key -> {"flag", "from", "placeholder"}: the script takes it from the command line with no default;
    # the YAML has the placeholder (``verl-bridge validate`` names it), the report's config does not
    to_fill: dict = field(default_factory=dict)
    old_source: bytes = b""
    new_source: Optional[bytes] = None
    yaml_text: Optional[str] = None
    script_target: Optional[str] = None
    config_target: Optional[str] = None

    def report(self) -> dict:
        d = asdict(self)
        return {k: d[k] for k in REPORT_KEYS}


def targets(path: str, out_dir: Optional[str], config_out: Optional[str]) -> tuple[str, str, str]:
    """(script target, config target, config path relative to the script's folder, posix)."""
    script_target = os.path.join(out_dir, os.path.basename(path)) if out_dir else path
    stem = module_name_for(path)
    config_target = config_out or os.path.join(os.path.dirname(script_target), f"{stem}.yaml")
    rel = os.path.relpath(os.path.abspath(config_target), os.path.dirname(os.path.abspath(script_target)))
    return script_target, config_target, rel.replace(os.sep, "/")


def _syntax_error(source: bytes, name: str) -> Optional[str]:
    """Python's own verdict (and line numbers) on the source, or None when it compiles."""
    try:
        compile(source, name, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return f"{name}:{exc.lineno}: cannot parse: {exc.msg}"
    except (ValueError, UnicodeDecodeError) as exc:
        return f"{name}: cannot parse: {exc}"
    except (RecursionError, MemoryError):
        return f"{name}: cannot parse: nested too deeply for Python's own parser"
    return None


def migrate_source(source: bytes, path: str, config_rel: Optional[str] = None,
                   source_dir: Optional[str] = None, config_dir: Optional[str] = None) -> FileResult:
    """Analyse and rewrite *source*; see :func:`_migrate_source`. Deep expressions (a generated
    file with a 3,000-term sum) need more than Python's default 1,000 frames for libcst's codegen."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 30_000))
    try:
        return _migrate_source(source, path, config_rel, source_dir, config_dir)
    finally:
        sys.setrecursionlimit(old)


def _migrate_source(source: bytes, path: str, config_rel: Optional[str] = None,
                    source_dir: Optional[str] = None, config_dir: Optional[str] = None) -> FileResult:
    """Analyse and rewrite *source* (the bytes of *path*) without touching the disk.

    *source_dir* is where local modules the script imports are looked up (default: the folder of
    *path*); *config_dir* is where the YAML will live (relative model paths are checked from there).
    """
    name = os.path.basename(path)
    result = FileResult(path=path, status="error", old_source=source)
    m = CONFLICT_RE.search(source)
    if m is not None:
        line = source[: m.start()].count(b"\n") + 1
        result.reasons.append(f"{name}:{line}: merge-conflict marker; resolve the conflict first")
        return result
    problem = _syntax_error(source, name)
    if problem is not None:
        result.reasons.append(problem)
        return result
    try:
        tree = cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        result.reasons.append(f"{name}:{exc.raw_line}: cannot parse: {exc.message}")
        return result
    except (UnicodeDecodeError, LookupError) as exc:
        result.reasons.append(f"{name}: cannot decode: {exc}")
        return result
    if source_dir is None:
        source_dir = os.path.dirname(os.path.abspath(path))
    cmd = MigratePPOLoopCommand(CodemodContext(filename=path), config_path=config_rel, source_dir=source_dir,
                                source=source)
    try:
        new_tree = cmd.migrate(tree)
    except SkipFile:
        pass
    except RecursionError:
        result.reasons.append(f"{name}: nested too deeply to analyse (recursion limit); split the deepest "
                              "expression into several statements")
        return result
    except Exception as exc:  # noqa: BLE001 - a bug of ours must not look like a refusal
        result.reasons.append(f"internal error while analysing {name}: {type(exc).__name__}: {exc}")
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
    result.defaults_used = dict(analysis.defaults_used)
    result.unmapped = list(analysis.unmapped)
    result.to_fill = dict(getattr(analysis, "to_fill", {}) or {})
    fit_batch_sizes(result)
    problems = validate_config(result, config_dir or os.path.dirname(os.path.abspath(path)))
    if problems:
        result.status = "refused"
        result.reasons += [f"the emitted config does not validate: {p}; fix the value in {name} (or the key "
                           "in the YAML) and run migrate again" for p in problems]
        result.config, result.provenance, result.defaults_used, result.unmapped = {}, {}, {}, []
        result.to_fill = {}
        return result
    new_source = new_tree.bytes
    try:
        compile(new_source, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        result.status = "error"
        result.reasons.append(f"internal error: the rewritten {name} does not parse ({exc})")
        return result
    result.status = "migrated"
    result.new_source = new_source
    result.yaml_text = render_yaml(*_with_placeholders(result), name)
    return result


def _with_placeholders(result: FileResult) -> tuple:
    """The config and provenance the YAML shows: the proven values plus a placeholder per ``to_fill``
    key (which ``verl-bridge validate`` / ``train`` refuse, naming the flag, until it is set)."""
    config, prov = dict(result.config), dict(result.provenance)
    for key, info in result.to_fill.items():
        if key not in config:
            config[key] = info["placeholder"]
            prov[key] = f"TO FILL: the script takes {info['flag']} from the command line ({info['from']})"
    return config, prov


def fit_batch_sizes(result: FileResult) -> None:
    """``algorithm.micro_batch_size`` is not in the script: pick the largest size <= verl-bridge's
    default that divides the samples per rank of a mini-batch (gradient accumulation, same update),
    and the smallest world (``trainer.nproc_per_node`` = tp * pp) the parallel sizes need."""
    from verl_bridge.codemods.recognize.report import schema_default

    cfg = result.config
    tp = cfg.get("trainer.args.tp_size", 1)
    pp = cfg.get("trainer.args.pp_size", 1)
    if isinstance(tp, int) and isinstance(pp, int) and tp * pp > 1 and "trainer.nproc_per_node" not in cfg:
        cfg["trainer.nproc_per_node"] = tp * pp
        result.provenance["trainer.nproc_per_node"] = f"derived: tp_size {tp} * pp_size {pp}"
        result.warnings.append(f"trainer.nproc_per_node={tp * pp} (tp_size * pp_size, the smallest world that fits); "
                               "the script's world size came from its launcher, set --nproc-per-node to match it")
    if "algorithm.micro_batch_size" in cfg:
        return
    rollout = cfg.get("data.rollout_batch_size", schema_default("data.rollout_batch_size"))
    group = cfg.get("algorithm.group_size", schema_default("algorithm.group_size"))
    mini = cfg.get("algorithm.mini_batch_size") or (rollout * group if isinstance(rollout, int) and
                                                    isinstance(group, int) else None)
    default = schema_default("algorithm.micro_batch_size")
    if isinstance(mini, int) and mini >= 1 and mini % default:
        micro = math.gcd(mini, default)
        cfg["algorithm.micro_batch_size"] = micro
        why = f"derived: largest size <= {default} dividing the mini-batch of {mini} samples"
        result.provenance["algorithm.micro_batch_size"] = why
        result.defaults_used["algorithm.micro_batch_size"] = {"value": micro, "from": why}


def validate_config(result: FileResult, config_dir: str) -> list:
    """The validator ``verl-bridge validate`` runs; a model directory that is not here yet is a warning."""
    from verl_bridge.config import ConfigError, load_config

    cfg = result.config
    world = cfg.get("trainer.nproc_per_node", 1)
    try:
        load_config(nest(cfg), world_size=world if isinstance(world, int) and world >= 1 else 1, check_paths=False)
    except ConfigError as exc:
        return list(exc.problems)
    path = cfg.get("model.actor.args.model_name_or_path")
    if isinstance(path, str):
        full = path if os.path.isabs(path) else os.path.join(config_dir, path)
        if not os.path.isdir(full):
            result.warnings.append(f"model.actor.args.model_name_or_path={path!r}: no such directory next to the "
                                   "config yet; `verl-bridge train` needs a local Hugging Face model directory there")
    return []


def _writable_problem(path: str) -> Optional[str]:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        folder = os.path.dirname(os.path.abspath(path))
        return None if os.access(folder, os.W_OK) or not os.path.isdir(folder) else \
            f"cannot write {path}: the folder is not writable"
    except OSError as exc:
        return f"cannot write {path}: {exc.strerror}"
    if not stat.S_ISREG(st.st_mode):
        return f"cannot write {path}: not a regular file"
    if not st.st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        return (f"cannot write {path}: the file is read-only (mode {stat.S_IMODE(st.st_mode):04o}); nothing was "
                f"changed. Make it writable (chmod u+w {path}) or write elsewhere with --out DIR")
    return None


def migrate_file(path: str, *, write: bool = False, out_dir: Optional[str] = None,
                 config_out: Optional[str] = None) -> FileResult:
    script_target, config_target, rel = targets(path, out_dir, config_out)
    try:
        with open(path, "rb") as fh:
            source = fh.read()
    except OSError as exc:
        return FileResult(path=path, status="error", reasons=[f"cannot read {path}: {exc.strerror}"])
    result = migrate_source(source, path, rel, source_dir=os.path.dirname(os.path.realpath(path)),
                            config_dir=os.path.dirname(os.path.abspath(config_target)))
    result.script_target, result.config_target = script_target, config_target
    if write and result.status == "migrated":
        write_pair(result)
    return result


def write_pair(result: FileResult) -> None:
    """YAML first, then the script (through a symlink to its target); on failure nothing half-written
    stays: the YAML is put back as it was and the entry says what failed."""
    script_real = os.path.realpath(result.script_target)
    for target in (result.config_target, script_real):
        problem = _writable_problem(target)
        if problem is not None:
            _failed(result, problem)
            return
    old_yaml = None
    if os.path.exists(result.config_target):
        try:
            with open(result.config_target, "rb") as fh:
                old_yaml = fh.read()
        except OSError as exc:
            _failed(result, f"cannot read {result.config_target}: {exc.strerror}")
            return
    try:
        atomic_write(result.config_target, result.yaml_text.encode("utf-8"))
    except OSError as exc:
        _failed(result, f"cannot write {result.config_target}: {exc.strerror or exc}")
        return
    try:
        atomic_write(script_real, result.new_source)
    except OSError as exc:
        try:
            if old_yaml is None:
                os.unlink(result.config_target)
            else:
                atomic_write(result.config_target, old_yaml)
        except OSError:
            pass
        _failed(result, f"cannot write {script_real}: {exc.strerror or exc}")


def _failed(result: FileResult, reason: str) -> None:
    result.status = "error"
    result.reasons.append(reason + "; the script and its config were left as they were")
