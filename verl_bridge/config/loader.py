"""Load a YAML config into typed dataclasses, apply ``key=value`` overrides, collect every error.

``load_config(path, overrides)`` is the one entry point. It never starts a process group and
never imports torch: problems are collected into a single :class:`ConfigError` that lists each
one as ``key=value: what is allowed``.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import types
import typing
from typing import Any, Optional, Union, get_args, get_origin, get_type_hints

import yaml

from verl_bridge.config.schema import Config, to_plain


class ConfigError(Exception):
    """Every problem found in a config, reported at once."""

    def __init__(self, problems: list[str], source: str | None = None):
        self.problems = problems
        self.source = source
        where = f" in {source}" if source else ""
        lines = [f"invalid config{where} ({len(problems)} problem{'s' if len(problems) != 1 else ''}):"]
        lines += [f"  - {p}" for p in problems]
        super().__init__("\n".join(lines))


def _fmt(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    return str(value)


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        names = [_type_name(a) for a in get_args(tp) if a is not type(None)]
        return " or ".join(names) + (" or null" if type(None) in get_args(tp) else "")
    if origin is tuple:
        return "a list of " + ", ".join(_type_name(a) for a in get_args(tp))
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {int: "an integer", float: "a number", bool: "true/false", str: "a string"}.get(tp, str(tp))


def _coerce(value: Any, tp: Any, key: str, problems: list[str]) -> Any:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _coerce(value, inner[0], key, problems)
    if dataclasses.is_dataclass(tp):
        if value is None:
            return tp()
        if not isinstance(value, dict):
            problems.append(f"{key}={_fmt(value)}: expected a mapping")
            return tp()
        return _build(tp, value, key + ".", problems)
    if origin is tuple:
        if isinstance(value, (list, tuple)) and len(value) == len(get_args(tp)):
            return tuple(_coerce(v, a, f"{key}[{i}]", problems) for i, (v, a) in enumerate(zip(value, get_args(tp))))
        problems.append(f"{key}={_fmt(value)}: expected {_type_name(tp)}")
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        problems.append(f"{key}={_fmt(value)}: expected true or false")
        return value
    if tp is int:
        number = None
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        elif isinstance(value, float) and value.is_integer():
            number = int(value)
        if number is not None:
            if abs(number) > MAX_INT:  # e.g. total_steps: 1e30; the keys' own bounds are in validate.py
                problems.append(f"{key}={_fmt(value)}: out of range; an integer setting is at most {MAX_INT}")
                return value
            return number
        problems.append(f"{key}={_fmt(value)}: expected an integer")
        return value
    if tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:  # an integer past float's range
                number = math.inf
        elif isinstance(value, str):  # YAML 1.1 reads "1e-5" as a string
            try:
                number = float(value)
            except ValueError:
                pass
        if number is None:
            problems.append(f"{key}={_fmt(value)}: expected a number")
            return value
        if not math.isfinite(number):  # 1e400 reads as inf, .nan as nan: neither is a setting
            problems.append(f"{key}={_fmt(value)}: expected a finite number (got {number})")
            return value
        return number
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        problems.append(f"{key}={_fmt(value)}: expected a string")
        return value
    return value


def _build(cls: type, data: dict, prefix: str, problems: list[str]) -> Any:
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    kwargs = {}
    for k, v in data.items():
        if k not in fields:
            close = difflib.get_close_matches(str(k), list(fields), n=1)
            hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
            problems.append(f"{prefix}{k}: unknown key{hint}; allowed keys here: {', '.join(sorted(fields))}")
            continue
        kwargs[k] = _coerce(v, hints[k], prefix + k, problems)
    return cls(**kwargs)


def parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError([f"override {item!r}: expected key=value, e.g. trainer.total_steps=10"])
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError([f"override {item!r}: '{key}' is not a dotted key"])
    try:
        value = safe_load(raw) if raw.strip() != "" else None
    except YAMLRefused as exc:
        raise ConfigError([f"override {item!r}: {exc}"]) from None
    except (yaml.YAMLError, RecursionError):
        value = raw
    return key.split("."), value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    problems = []
    for item in overrides or []:
        try:
            parts, value = parse_override(item)
        except ConfigError as exc:
            problems += exc.problems
            continue
        node = data
        for p in parts[:-1]:
            if not isinstance(node.get(p), dict):
                node[p] = {}
            node = node[p]
        node[parts[-1]] = value
    if problems:
        raise ConfigError(problems)
    return data


# Limits of the config reader: a config is a few hundred nodes, so these refuse only hostile or
# broken files (an anchor/alias "billion laughs" bomb, 20,000-deep nesting) quickly, before any
# expansion, instead of a traceback or a MemoryError minutes later.
MAX_ALIASES = 64  # ``*name`` references in one file
MAX_NODES = 100_000  # nodes once every alias is expanded
MAX_DEPTH = 64  # nesting of mappings and lists
MAX_INT = 2**63 - 1  # any integer key (int64, what torch and the checkpoint files hold)


class YAMLRefused(yaml.YAMLError):
    """A file that parses but is refused (alias budget, depth, duplicate keys); ``str()`` says why."""


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses more than :data:`MAX_ALIASES` aliases, documents that expand
    past :data:`MAX_NODES` nodes, nesting deeper than :data:`MAX_DEPTH`, and duplicate mapping keys
    (PyYAML keeps the last one silently)."""

    def __init__(self, stream):
        super().__init__(stream)
        self._aliases = 0
        self._depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                mark = self.peek_event().start_mark
                raise YAMLRefused(f"more than {MAX_ALIASES} YAML aliases (*name), the {MAX_ALIASES + 1}th at "
                                  f"line {mark.line + 1}; a config needs few, so this looks like an alias bomb: "
                                  "write the values out")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise YAMLRefused(f"nesting deeper than {MAX_DEPTH} levels at line {mark.line + 1}; "
                                  "a config is a few levels of sections")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self):
        node = super().compose_document()
        _check_nodes(node)
        return node


def _check_nodes(root) -> None:
    """Refuse duplicate keys (naming the dotted key and both lines) and a document that expands past
    :data:`MAX_NODES` nodes; shared (aliased) nodes are counted once per use, walked once."""
    sizes: dict[int, int] = {}
    duplicates: list[str] = []

    def size(node, path: str) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        sizes[id(node)] = 1  # a recursive alias counts once instead of looping
        total = 1
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    name = f"{path}{key.value}"
                    if key.value in seen:
                        duplicates.append(f"duplicate key '{name}' at lines {seen[key.value]} and "
                                          f"{key.start_mark.line + 1}; YAML would keep only the last, so remove one")
                    else:
                        seen[key.value] = key.start_mark.line + 1
                    total += size(value, name + ".")
                else:
                    total += size(key, path) + size(value, path)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                total += size(item, f"{path[:-1]}[{i}]." if path else f"[{i}].")
        sizes[id(node)] = total
        return total

    if root is not None and size(root, "") > MAX_NODES:
        raise YAMLRefused(f"the document expands to more than {MAX_NODES} nodes once its aliases are "
                          "resolved; a config is a few hundred, so this looks like an alias bomb")
    if duplicates:
        raise YAMLRefused("; ".join(duplicates))


def safe_load(text: str):
    """``yaml.safe_load`` with :class:`StrictLoader`'s limits."""
    loader = StrictLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def read_yaml(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise ConfigError([f"config file {path!r} does not exist"]) from None
    except IsADirectoryError:
        raise ConfigError([f"config file {path!r} is a directory; give a YAML file"]) from None
    except OSError as exc:
        raise ConfigError([f"config file {path!r} cannot be read: {exc.strerror}"]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise ConfigError([f"not UTF-8 text: byte 0x{raw[exc.start]:02x} at line {line} (offset {exc.start}); "
                           "save the config as UTF-8"], source=path) from None
    try:
        data = safe_load(text)
    except YAMLRefused as exc:
        raise ConfigError([str(exc)], source=path) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        problem = getattr(exc, "problem", None) or str(exc)
        constructor = isinstance(exc, yaml.constructor.ConstructorError)
        tag = re.search(r"for the tag '([^']+)'", problem) if constructor else None
        if tag is not None:
            name = tag.group(1).replace("tag:yaml.org,2002:", "!!")
            raise ConfigError([f"the YAML tag {name} at {where} is not allowed: a config is plain YAML (mappings, "
                               "lists, strings, numbers, true/false, null); tags that build Python objects are "
                               "never constructed. Write the value itself, or a 'module:function' string where a "
                               "key takes one (model.actor.args.model_provider, model.reward.args.path)"],
                              source=path) from None
        kind = "YAML error" if constructor else "YAML syntax error"
        raise ConfigError([f"{kind} at {where}: {problem}"], source=path) from None
    except RecursionError:  # belt and braces: MAX_DEPTH refuses deep nesting first
        raise ConfigError([f"nesting too deep (over {MAX_DEPTH} levels)"], source=path) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([f"the top level must be a mapping of sections, got {type(data).__name__}"], source=path)
    return data


def apply_defaults(cfg: Config) -> Config:
    """Derived defaults: an algorithm whose spec needs a critic (ppo: GAE) gets one when none is
    configured: the actor's model with a value head."""
    from verl_bridge.algorithms.registry import ALGORITHMS
    from verl_bridge.config.schema import ModelRole

    spec = ALGORITHMS.get(cfg.algorithm.name)
    if spec is not None and spec.needs_critic and cfg.model.critic is None:
        cfg.model.critic = ModelRole(type="megatron")
    return cfg


# ``verl-bridge migrate`` writes this for a value the original script took from the command line
# with no default (``--model_name`` required): the key is there, the value is the user's to give.
PLACEHOLDER_PREFIX = "<fill: "


def is_placeholder(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(PLACEHOLDER_PREFIX) and value.endswith(">")


def placeholders(data: Any, prefix: str = "") -> list[str]:
    """One problem per placeholder left in *data* (nested dicts), naming the key and what to set."""
    out: list[str] = []
    if isinstance(data, dict):
        for k, v in data.items():
            key = f"{prefix}{k}"
            if isinstance(v, dict):
                out += placeholders(v, key + ".")
            elif is_placeholder(v):
                what = v[len(PLACEHOLDER_PREFIX):-1]
                out.append(f"{key}: placeholder {v!r} written by `verl-bridge migrate`: the original script takes "
                           f"this value from the command line ({what}) with no default; set it in the YAML or "
                           f"pass {key}=VALUE")
    return out


def _without_placeholders(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _without_placeholders(v) for k, v in data.items() if not is_placeholder(v)}
    return data


def load_config(
    path: Union[str, os.PathLike, dict, Config, None] = None,
    overrides: Optional[list[str]] = None,
    world_size: Optional[int] = None,
    check_paths: bool = True,
    require_model_source: bool = False,
) -> Config:
    """Load, override and validate a config. Raises :class:`ConfigError` listing every problem.

    ``path`` may be a YAML file, a dict, an existing :class:`Config` or ``None`` (defaults).
    ``world_size`` defaults to ``$WORLD_SIZE`` (or 1); the parallel arithmetic is checked against it.
    ``require_model_source``: a config that names no actor model (``model.actor.args.preset`` /
    ``model_name_or_path`` / ``model_provider``) is a problem. The command line asks for it; in
    Python the model may come from a :class:`~verl_bridge.MegatronBridge` instead, so a trainer
    without a bridge checks it when it starts (:meth:`MegatronBridge.from_config`).
    """
    from verl_bridge.config.validate import validate

    source = None
    if isinstance(path, Config):
        data, source_dir = to_plain(path), path.source_dir
    elif path is None:
        data, source_dir = {}, os.getcwd()
    elif isinstance(path, dict):
        data, source_dir = dict(path), os.getcwd()
    else:
        source = os.fspath(path)
        data = read_yaml(source)
        source_dir = os.path.dirname(os.path.abspath(source))
    data = apply_overrides(data, overrides or [])
    structural: list[str] = placeholders(data)
    if structural:  # a placeholder is not a value of the key's type: name it, not its type
        data = _without_placeholders(data)
    cfg = apply_defaults(_build(Config, data, "", structural))
    cfg.source_dir = source_dir
    if world_size is None:
        world_size = int(os.environ.get("WORLD_SIZE", cfg.trainer.nproc_per_node or 1))
    try:
        semantic = validate(cfg, world_size=world_size, check_paths=check_paths,
                            require_model_source=require_model_source)
    except (TypeError, ValueError, AttributeError, KeyError):  # values of the wrong type trip semantic checks
        if not structural:
            raise
        semantic = []
    # structural and semantic problems together, so every problem is listed at once
    problems = structural + [p for p in semantic if p not in structural]
    if problems:
        raise ConfigError(problems, source=source)
    return cfg


def dump_config(cfg: Config) -> str:
    return yaml.safe_dump(to_plain(cfg), sort_keys=False)
