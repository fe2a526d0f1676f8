"""Build the recogniser on a snippet (and optional local modules) for the per-concern tests."""

from __future__ import annotations

import os
import textwrap

import libcst as cst

from verl_bridge.codemods._static import Program
from verl_bridge.codemods.recognize import Recognizer


def recognizer(src: str, tmp_path=None, modules: dict | None = None, run: bool = True) -> Recognizer:
    src = textwrap.dedent(src)
    source_dir = None
    if modules:
        for name, text in modules.items():
            (tmp_path / name).write_text(textwrap.dedent(text))
        source_dir = str(tmp_path)
    prog = Program(cst.parse_module(src), "t.py", source_dir=source_dir, source=src.encode())
    r = Recognizer(prog, "t")
    if run:
        r.run()
    return r


def expr(r: Recognizer, code: str):
    """The first node of the program whose code is *code*."""
    for n in r.p.all_nodes():
        if isinstance(n, cst.BaseExpression) and r.p.module.code_for_node(n) == code:
            return n
    raise AssertionError(f"{code!r} not found")


# a minimal GRPO loop the tests vary
GRPO = """
import torch

def model_provider(pre_process=True, post_process=True):
    return build()

def reward_fn(response_text, ground_truth):
    return 1.0

def main():
    model = model_provider()
    ref = model_provider()
    ref.requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    for step in range(STEPS):
        out = model.generate(prompts(), max_new_tokens=64)
        r = torch.tensor([reward_fn(t, a) for t, a in pairs(out)])
        g = r.view(-1, 4)
        adv = ((g - g.mean(dim=1, keepdim=True)) / (g.std(dim=1, keepdim=True) + 1e-6)).view(-1)
        old = lp(model, out).detach()
        ref_lp = lp(ref, out)
        new = lp(model, out)
        ratio = torch.exp(new - old)
        pg = -torch.min(ratio * adv, torch.clamp(ratio, 1 - 0.2, 1 + 0.2) * adv)
        kl = new - ref_lp
        loss = (pg + 0.05 * kl).mean()
        loss.backward()
        opt.step()

STEPS = 10

if __name__ == "__main__":
    main()
"""
