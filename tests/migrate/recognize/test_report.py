"""report.py: every canonical key is from the source or in defaults_used; unmapped hyperparameters."""

from verl_bridge.codemods.recognize.report import CANONICAL_KEYS, schema_default

from .helpers import GRPO, recognizer


def test_defaults_used_covers_every_key_not_in_the_source():
    r = recognizer(GRPO)
    for key in CANONICAL_KEYS:
        assert (key in r.a.config) != (key in r.a.defaults_used), key
    assert r.a.defaults_used["algorithm.lam"] == {"value": schema_default("algorithm.lam"), "from": "verl-bridge default"}


def test_unmapped_constants_are_listed():
    r = recognizer(GRPO.replace("STEPS = 10\n", "STEPS = 10\nWARMUP = 7\n"))
    assert any(u.startswith("WARMUP=7 (t.py:") for u in r.a.unmapped)
    assert not any(u.startswith("STEPS=") for u in r.a.unmapped)  # it became trainer.total_steps
