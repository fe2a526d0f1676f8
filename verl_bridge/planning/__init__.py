"""Planning before launch: per-rank memory (:mod:`.memory`), weight-sync cost (:mod:`.refit`), model
shapes without weights (:mod:`.shapes`). Pure arithmetic on the config; torch only to detect the
device's memory or measure a copy bandwidth when asked."""

from __future__ import annotations

from typing import Optional


def detect_device_memory() -> tuple[Optional[float], str]:
    """Total memory of CUDA device 0 in bytes, or ``None`` without a GPU."""
    try:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            return float(props.total_memory), f"detected: {props.name}"
    except (ImportError, OSError, RuntimeError):  # a broken torch or driver is doctor's business
        pass
    return None, "no GPU detected and --device-memory-gb not given: fit not checked"


def dry_run_lines(cfg, world: int, has_cuda: bool = False) -> list[str]:
    """The memory estimate appended to ``verl-bridge train --dry-run`` (never raises)."""
    from verl_bridge.planning.memory import memory_table, plan_memory
    from verl_bridge.planning.shapes import ShapeError, resolve_shape

    try:
        shape, source = resolve_shape(cfg)
    except ShapeError as exc:
        return [f"memory          not estimated: {exc}"]
    device, device_source = detect_device_memory() if has_cuda else (None, "no GPU: fit not checked")
    plan = plan_memory(cfg, world, shape, source, device, device_source)
    lines = memory_table(plan)
    lines += [f"warning         {w}" for w in plan.warnings]
    lines.append("                (details, refit cost, --device-memory-gb: verl-bridge plan CONFIG)")
    return lines
