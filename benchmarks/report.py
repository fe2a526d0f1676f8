"""Render the README's "Performance" table and plot from ``benchmarks/results/*-cuda.json``.

    python benchmarks/report.py            # prints the Markdown table, writes results/performance.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
# the goals of issue #24 (each a ratio measured side by side in one run on one H200)
GOALS = {"rollout": 4.5, "weight_export": 0.35, "rl_step": 5.0}
GENERAL_EXPORT_GOAL = 0.25


def _load(device: str) -> dict[str, dict]:
    out = {}
    for name in GOALS:
        p = RESULTS / f"{name}-{device}.json"
        if p.is_file():
            out[name] = json.loads(p.read_text())
    return out


def rows(device: str = "cuda") -> list[tuple[str, str, str, str, str]]:
    data = _load(device)
    table = []
    if "rollout" in data:
        d = data["rollout"]
        base = d["baseline"]
        table.append(("rollout (tokens/s)", f"{d['results']['native_tokens_per_s']:,.0f}",
                      f"HF generate dynamic {base.get('hf_dynamic_tokens_per_s', 0):,.0f} / static "
                      f"{base.get('hf_static_tokens_per_s', 0):,.0f}", f"{d['ratio']:.2f}x", f">= {GOALS['rollout']}x"))
    if "weight_export" in data:
        d = data["weight_export"]
        table.append(("weight_export (GB/s)", f"{d['results']['export_GBps']:,.0f}",
                      f"device copy {d['baseline']['copy_GBps']:,.0f}", f"{d['ratio']:.1%}", f">= {GOALS['weight_export']:.0%}"))
        coalesced = "general_coalesced_GBps" in d["results"]
        if "general_path_GBps" in d["results"]:
            # with a coalesced row beside it, this is the per-tensor path that coalescing replaced
            g = d["results"]["general_path_GBps"]
            label = "weight_export, general path per tensor (coalesce=False; GB/s)" if coalesced else \
                "weight_export, general path (GB/s)"
            table.append((label, f"{g:,.0f}", f"device copy {d['baseline']['copy_GBps']:,.0f}",
                          f"{g / d['baseline']['copy_GBps']:.1%}", "-" if coalesced else f">= {GENERAL_EXPORT_GOAL:.0%}"))
        if coalesced:
            g = d["results"]["general_coalesced_GBps"]
            table.append(("weight_export, general path coalesced (GB/s)", f"{g:,.0f}",
                          f"device copy {d['baseline']['copy_GBps']:,.0f}",
                          f"{g / d['baseline']['copy_GBps']:.1%}", f">= {GENERAL_EXPORT_GOAL:.0%}"))
    if "rl_step" in data:
        d = data["rl_step"]
        r, b = d["results"], d["baseline"]
        ours = f"{r['tokens_per_s']:,.0f}" if "tokens_per_s" in r else "error"
        theirs = f"TRL GRPOTrainer {b['tokens_per_s']:,.0f}" if "tokens_per_s" in b else "TRL: error"
        ratio = f"{d['ratio']:.2f}x" if d.get("ratio") else "n/a"
        if len(r.get("runs", [])) > 1:  # rl_step.py --runs N: each run's ratio, fresh processes
            ratio += " (runs: " + " / ".join(f"{x['ratio']:.2f}x" if "ratio" in x else "error" for x in r["runs"]) + ")"
        table.append(("rl_step (tokens/s)", ours, theirs, ratio, f">= {GOALS['rl_step']}x"))
    return table


def load_lines(device: str = "cuda") -> list[str]:
    """What each run ran under: SM clock, power and the bf16 matmul rate measured in the same run."""
    out = []
    for name, d in _load(device).items():
        env = d.get("environment", {})
        smi = env.get("nvidia_smi") or {}
        if smi or "bf16_matmul_tflops_measured" in env:
            out.append(f"{name} ({d['when']}, {env.get('gpu', '?')}): SM clock {smi.get('clocks.sm', '?')} of {smi.get('clocks.max.sm', '?')}, "
                       f"{smi.get('power.draw', '?')}, bf16 matmul {env.get('bf16_matmul_tflops_measured', '?')} TFLOP/s "
                       f"measured in the same run; megatron-core {env.get('megatron.core', '?')}, torch {env.get('torch', '?')}")
    return out


def markdown(device: str = "cuda") -> str:
    lines = ["| benchmark | verl-bridge | comparison (same run) | ratio | goal |", "|---|---|---|---|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows(device)]
    loads = load_lines(device)
    if loads:
        lines += [""] + [f"- {line}" for line in loads]
    return "\n".join(lines)


def plot(device: str = "cuda") -> Path | None:
    data = _load(device)
    if not data:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in GOALS if n in data and data[n].get("ratio")]
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.bar(names, [data[n]["ratio"] for n in names], color="#4c72b0", label="measured ratio")
    ax.scatter(names, [GOALS[n] for n in names], color="#dd8452", marker="_", s=900, linewidths=3, label="goal", zorder=3)
    ax.set_yscale("log")
    ax.set_ylabel("ours / comparison")
    ax.set_title(f"verl-bridge vs comparison, same run ({device})")
    ax.legend()
    fig.tight_layout()
    out = RESULTS / "performance.png"
    fig.savefig(out, dpi=120)
    return out


if __name__ == "__main__":
    dev = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    print(markdown(dev))
    print(plot(dev))
