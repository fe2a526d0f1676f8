"""A reward function the script imports from a project module is named by that module's import path."""

from __future__ import annotations

from .helpers import GRPO, recognizer


def test_reward_from_a_project_module_names_that_module(tmp_path):
    src = GRPO.replace("import torch\n", "import torch\nfrom scoring import exact_score\n", 1).replace(
        "reward_fn(t, a) for t, a in pairs(out)", "exact_score(t, a) for t, a in pairs(out)")
    r = recognizer(src, tmp_path, {"scoring.py": "def exact_score(text, truth):\n    return float(text == truth)\n"})
    assert r.a.status == "migrate", r.a.reasons
    assert r.a.config["model.reward.args.path"] == "scoring:exact_score"
