"""The project's own adaptive KL controller read by its update rule (target and horizon reached through a
settings object), and fields of a nested config overwritten at run time by a small arithmetic helper."""

from __future__ import annotations

import os

from .helpers import recognizer

FIX = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "kl_controller.py")


def _variant() -> str:
    src = open(FIX).read()
    src = src.replace("import torch\n", """import torch
from dataclasses import dataclass, field


@dataclass
class KLSettings:
    goal: float = 4.5
    span: int = 2500


@dataclass
class Batches:
    per_step: int = 24
    splits: int = 3
    chunk: int = 0


@dataclass
class Setup:
    kl: KLSettings = field(default_factory=KLSettings)
    sizes: Batches = field(default_factory=Batches)


def even_split(total, parts):
    each = total // parts
    if each * parts != total:
        raise ValueError("uneven")
    return each
""", 1)
    src = src.replace("""    def __init__(self, init_kl_coef, target, horizon):
        self.value = init_kl_coef
        self.target = target
        self.horizon = horizon

    def update(self, current, n_steps):
        proportional_error = np.clip(current / self.target - 1, -0.2, 0.2)
        self.value *= 1 + proportional_error * n_steps / self.horizon""", """    def __init__(self, init_kl_coef, settings):
        self.value = init_kl_coef
        self.settings = settings

    def update(self, current, n_steps):
        off = np.clip(current / self.settings.goal - 1, -0.2, 0.2)
        self.value *= 1 + off * n_steps / self.settings.span""")
    src = src.replace("    kl_ctl = AdaptiveKLController(0.05, 6.0, 10000)\n",
                      "    cfg = Setup()\n    cfg.sizes.chunk = even_split(cfg.sizes.per_step, cfg.sizes.splits)\n"
                      "    kl_ctl = AdaptiveKLController(0.05, cfg.kl)\n")
    src = src.replace("""        logp = lp(actor, seqs)
        ratio = torch.exp(logp - old_logp)
        loss = -torch.min(ratio * ret, torch.clamp(ratio, 0.8, 1.2) * ret).mean()
        loss = -torch.min(ratio * ret, torch.clamp(ratio, 1 - 0.2, 1 + 0.2) * ret).mean()
        value_loss = ((values - ret) ** 2).mean()
        total = loss + 0.5 * value_loss
        optimizer.zero_grad()
        total.backward()
        optimizer.step()""", """        optimizer.zero_grad()
        for s in range(0, cfg.sizes.per_step, cfg.sizes.chunk):
            logp = lp(actor, seqs[s:s + cfg.sizes.chunk])
            ratio = torch.exp(logp - old_logp[s:s + cfg.sizes.chunk])
            r = ret[s:s + cfg.sizes.chunk]
            loss = -torch.min(ratio * r, torch.clamp(ratio, 1 - 0.2, 1 + 0.2) * r).mean()
            value_loss = ((values[s:s + cfg.sizes.chunk] - r) ** 2).mean()
            (loss + 0.5 * value_loss).backward()
        optimizer.step()""")
    return src


def test_controller_roles_and_runtime_field():
    src = _variant()
    assert "cfg.sizes.chunk = even_split" in src and "self.settings.span" in src and "cfg.sizes.chunk):" in src
    r = recognizer(src)
    c = r.a.config
    assert c.get("algorithm.kl.target") == 4.5 and c.get("algorithm.kl.horizon") == 2500, (c, r.a.warnings)
    assert c.get("algorithm.kl.coef") == 0.05
    # chunk's default 0 is stale: the run-time value even_split(24, 3) = 8 is the micro-batch
    assert c.get("algorithm.micro_batch_size") == 8, (c, r.a.warnings)
