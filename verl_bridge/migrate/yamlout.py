"""Render the extracted config (dotted keys) as nested YAML with a provenance comment per value."""

from __future__ import annotations

import yaml

KEY_ORDER = ("trainer", "model", "data", "algorithm", "optim", "rollout")


def nest(config: dict) -> dict:
    out: dict = {}
    for key, value in config.items():
        cur = out
        parts = key.split(".")
        for p in parts[:-1]:
            cur = cur.setdefault(p, {})
        cur[parts[-1]] = value
    return out


def _scalar(value) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000)
    text = text.strip()
    if text.endswith("\n..."):
        text = text[: -len("\n...")]
    if text.endswith("..."):
        text = text[:-3].strip()
    return text


def render_yaml(config: dict, provenance: dict, source_name: str) -> str:
    """YAML text; ``yaml.safe_load`` of it gives back ``nest(config)``."""
    lines = [
        f"# Written by `verl-bridge migrate` from {source_name}.",
        "# Each comment says where the value comes from: a line of the script, or a framework's default",
        "# the script relies on. Keys not listed use MegatronTrainer's defaults (the migrate report lists",
        "# them under defaults_used). Override any of them: verl-bridge train THIS.yaml key=value",
    ]
    tree = nest(config)

    def emit(node: dict, prefix: str, indent: int) -> None:
        keys = list(node)
        if indent == 0:
            keys.sort(key=lambda k: (KEY_ORDER.index(k) if k in KEY_ORDER else len(KEY_ORDER), k))
        for k in keys:
            v = node[k]
            dotted = f"{prefix}{k}"
            pad = "  " * indent
            if isinstance(v, dict):
                lines.append(f"{pad}{k}:")
                emit(v, dotted + ".", indent + 1)
            else:
                where = provenance.get(dotted)
                comment = f"  # {where}" if where else ""
                lines.append(f"{pad}{k}: {_scalar(v)}{comment}")

    emit(tree, "", 0)
    return "\n".join(lines) + "\n"
