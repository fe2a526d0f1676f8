"""A config chosen by an ``if`` whose test the defaults settle, and a helpers module that also holds an
unused preference (DPO) loss next to the functions the RL loop calls."""

from __future__ import annotations

from .helpers import GRPO, recognizer


def test_assignment_in_the_branch_a_settled_test_takes():
    # `if args.resume: lr = 1e-4 else: lr = 3e-7` with --resume off: the else branch's value
    src = GRPO.replace("    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)\n", """\
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    if args.resume:
        lr = 1e-4
    else:
        lr = 3e-7
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
""")
    r = recognizer(src)
    assert r.a.status == "migrate", r.a.reasons
    assert r.a.config["optim.actor.lr"] == 3e-7


def test_assignment_in_an_unsettled_branch_is_left_out():
    src = GRPO.replace("    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)\n", """\
    import os
    if os.environ.get("FAST"):
        lr = 1e-4
    else:
        lr = 3e-7
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
""")
    r = recognizer(src)
    assert "optim.actor.lr" not in r.a.config


HELPERS = """
import torch
import torch.nn.functional as F


def clipped(new, old, adv):
    ratio = torch.exp(new - old)
    return -torch.min(ratio * adv, torch.clamp(ratio, 1 - 0.2, 1 + 0.2) * adv)


def pair_loss(pol_chosen, pol_rejected, ref_chosen, ref_rejected, beta=0.1):
    return -F.logsigmoid(beta * ((pol_chosen - ref_chosen) - (pol_rejected - ref_rejected))).mean()
"""


def test_unreached_preference_loss_in_a_helpers_module_is_not_a_blocker(tmp_path):
    src = GRPO.replace("import torch\n", "import torch\nfrom rl_helpers import clipped\n", 1).replace(
        "        ratio = torch.exp(new - old)\n        pg = -torch.min(ratio * adv, torch.clamp(ratio, 1 - 0.2, 1 + 0.2) * adv)\n",
        "        pg = clipped(new, old, adv)\n")
    r = recognizer(src, tmp_path, {"rl_helpers.py": HELPERS})
    assert not any("preference" in x for x in r.a.reasons), r.a.reasons
    assert r.a.status == "migrate", r.a.reasons


def test_reached_preference_loss_still_refuses(tmp_path):
    src = GRPO.replace("import torch\n", "import torch\nfrom rl_helpers import pair_loss\n", 1).replace(
        "        loss = (pg + 0.05 * kl).mean()\n",
        "        loss = (pg + 0.05 * kl).mean() + pair_loss(new, new, ref_lp, ref_lp)\n")
    r = recognizer(src, tmp_path, {"rl_helpers.py": HELPERS})
    assert any("preference loss" in x for x in r.a.reasons), r.a.reasons


def test_override_by_an_optional_flag_that_is_not_given():
    # `if args.lr: cfg.lr = args.lr` with --lr optional and without a default: None unless given, so the
    # dataclass default is what the script trains with; a required flag stays a command-line value
    src = GRPO.replace("import torch\n", "import argparse\nfrom dataclasses import dataclass\nimport torch\n\n\n"
                       "@dataclass\nclass RunCfg:\n    lr: float = 2e-6\n", 1).replace(
        "    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)\n", """\
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float)
    args = parser.parse_args()
    cfg = RunCfg()
    if args.lr:
        cfg.lr = args.lr
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
""")
    r = recognizer(src)
    assert r.a.status == "migrate", r.a.reasons
    assert r.a.config["optim.actor.lr"] == 2e-6
    r2 = recognizer(src.replace('parser.add_argument("--lr", type=float)',
                                'parser.add_argument("--lr", type=float, required=True)'))
    assert "optim.actor.lr" not in r2.a.config
