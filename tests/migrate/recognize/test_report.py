"""report.py: every canonical key is from the source or in defaults_used; unmapped hyperparameters."""

from verl_bridge.codemods.recognize.report import CANONICAL_KEYS, schema_default

from .helpers import GRPO, recognizer


def test_defaults_used_covers_every_key_not_in_the_source():
    r = recognizer(GRPO)
    for key in CANONICAL_KEYS:
        used = r.a.defaults_used.get(key)
        if key in r.a.config:  # from the source, or a framework's default the source relies on (named)
            assert used is None or used["from"] != "verl-bridge default", key
        else:
            assert used is not None and used["from"] == "verl-bridge default", key
    # torch.optim.AdamW(params, lr=...) without weight_decay decays by torch's default 0.01
    assert r.a.config["optim.actor.weight_decay"] == 0.01
    assert r.a.defaults_used["optim.actor.weight_decay"]["from"].startswith("torch.optim.AdamW default")
    assert r.a.defaults_used["algorithm.lam"] == {"value": schema_default("algorithm.lam"), "from": "verl-bridge default"}


def test_unmapped_constants_are_listed():
    r = recognizer(GRPO.replace("STEPS = 10\n", "STEPS = 10\nWARMUP = 7\n"))
    assert any(u.startswith("WARMUP=7 (t.py:") for u in r.a.unmapped)
    assert not any(u.startswith("STEPS=") for u in r.a.unmapped)  # it became trainer.total_steps
